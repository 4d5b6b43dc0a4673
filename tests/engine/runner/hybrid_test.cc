// A hybrid model (attention and Mamba-2 layers, as Jamba, Nemotron-H, Granite 4) is one family
// description away: this test registers one, written only with the parts families share
// (llama.h's attention and MLP declarations, mamba2.h's DeclareSsmMixer / ForwardSsmMixer), and
// runs it on the CPU runner with dummy weights. Its attention layers are the only KV cache
// layers; its Mamba layers hold state slots; a prompt gives the same logits in chunks as at once
// (the recurrent state carried between steps, the KV cache read back), and batched sequences in
// arbitrary slots the logits each has alone. No outside reference exists for this made-up model:
// what it checks is the composition, on the fixture tests' scale (testing::ScaledError), within
// family_test.cc's bound for chunks (5e-5: chunks change OpenBLAS's blocking of the attention
// layers' projections).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/families/llama.h"
#include "engine/model/families/mamba2.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/step_batches.h"

namespace lmserve::engine {
namespace {

// Layer l: a Mamba-2 mixer (l even) or grouped-query attention (l odd), each followed by a
// SiLU-gated MLP, pre-norm residual blocks.
class HybridDescription final : public ModelDescription {
 public:
  explicit HybridDescription(const ModelConfig& c) : ModelDescription(c) {
    kv_windows_.clear();  // one KV cache layer per attention layer
    rotary_ = DecoderRotary(c);
    WeightPlan& w = weights_;
    const DecoderEnds ends = AddDecoderEnds(w, c);
    embed_ = ends.embed;
    final_norm_ = ends.final_norm;
    lm_head_ = ends.lm_head;
    int64_t kv_layer = 0, state_layer = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer layer;
      layer.input_norm =
          AddNorm(w, c, "input_layernorm", l, LayerTensorName(l, "input_layernorm.weight"));
      if (IsSsmLayer(c, l)) {
        layer.mixer = DeclareSsmMixer(w, c, l, state_layer++, LayerTensorName(l, "mixer."));
      } else {
        layer.attention = DecoderAttention(c, l);
        layer.attention.layer = kv_layer++;
        kv_windows_.push_back(0);
        layer.qkv = AddQkv(w, c, l, /*fused=*/false, /*qk_norm=*/false, &layer.attention);
        layer.o_proj = AddOutputProjection(w, c, l);
      }
      layer.post_norm = AddNorm(w, c, "post_attention_layernorm", l,
                                LayerTensorName(l, "post_attention_layernorm.weight"));
      layer.gate_up = AddGateUp(w, c, l, /*fused=*/false);
      layer.down = AddDown(w, c, l);
      layers_.push_back(layer);
    }
  }

  absl::Status Forward(ForwardOps& ops) const override {
    const float eps = static_cast<float>(config_.rms_norm_eps);
    LMSERVE_RETURN_IF_ERROR(ops.Embed(embed_, 1.0f));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      if (l == 0) {
        LMSERVE_RETURN_IF_ERROR(
            ops.RmsNorm(Buffer::kResidual, layer.input_norm, eps, Buffer::kNormed));
      } else {
        LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected,
                                               layer.input_norm, eps, Buffer::kNormed));
      }
      if (IsSsmLayer(config_, static_cast<int64_t>(l))) {
        LMSERVE_RETURN_IF_ERROR(
            ForwardSsmMixer(ops, layer.mixer, Buffer::kNormed, Buffer::kProjected));
      } else {
        LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.qkv, Buffer::kNormed, Buffer::kQkv));
        LMSERVE_RETURN_IF_ERROR(ops.RotaryAndCacheWrite(layer.attention, Buffer::kQkv));
        LMSERVE_RETURN_IF_ERROR(ops.Attention(layer.attention, Buffer::kQkv, Buffer::kAttention));
        LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.o_proj, Buffer::kAttention, Buffer::kProjected));
      }
      LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected,
                                             layer.post_norm, eps, Buffer::kNormed));
      LMSERVE_RETURN_IF_ERROR(ops.GatedLinear(layer.gate_up, Activation::kSilu, Buffer::kNormed,
                                              Buffer::kActivation));
      LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.down, Buffer::kActivation, Buffer::kProjected));
    }
    LMSERVE_RETURN_IF_ERROR(
        ops.FinalNorm(Buffer::kResidual, Buffer::kProjected, final_norm_, eps));
    LMSERVE_RETURN_IF_ERROR(ops.LmHead(lm_head_, 0.0f));
    return ops.Sample();
  }

 private:
  struct Layer {
    Weight input_norm, post_norm, qkv, o_proj, gate_up, down;
    AttentionLayer attention;
    SsmMixer mixer;
  };
  Weight embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

void RegisterHybridFamilyOnce() {
  static const bool registered = [] {
    ModelFamily family;
    family.name = "test_hybrid";
    family.hf_architectures = {"TestHybridForCausalLM"};
    family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
      SsmConfig& s = out->ssm;
      s.num_heads = config.at("ssm_heads").get<int64_t>();
      s.head_dim = config.at("ssm_head_dim").get<int64_t>();
      s.state_size = config.at("ssm_state").get<int64_t>();
      s.n_groups = 1;
      s.conv_kernel = 4;
      s.chunk_size = 8;
      for (int64_t l = 0; l < out->num_layers; ++l) out->ssm_layers.push_back(l % 2 == 0);
      return absl::OkStatus();
    };
    family.describe = [](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
      return std::make_unique<HybridDescription>(config);
    };
    RegisterModelFamily(std::move(family));
    return true;
  }();
  (void)registered;
}

class HybridTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterHybridFamilyOnce();
    const std::string dir = testing::TempDir() + "/hybrid_model";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << R"({
      "architectures": ["TestHybridForCausalLM"], "vocab_size": 256, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
      "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
      "ssm_heads": 4, "ssm_head_dim": 32, "ssm_state": 16})";
    auto checkpoint = OpenConfigOnlyCheckpoint(dir);
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = *std::move(checkpoint);
    RunnerConfig config;
    config.load_format = LoadFormat::kDummy;
    config.dtype = RunnerDType::kFloat32;
    config.kv_cache_bytes = int64_t{4} << 20;
    config.max_num_seqs = 4;
    config.num_threads = 2;
    auto runner = ModelRunner::Create(*checkpoint_, config);
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
  }

  std::vector<float> Logits(const std::vector<int32_t>& prompt, size_t chunk, int32_t slot,
                            int32_t first_block) {
    return testing::PromptLogits(*runner_, prompt, chunk, slot, first_block);
  }

  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(HybridTest, AttentionLayersHoldKvBlocksAndMambaLayersStateSlots) {
  const ModelConfig& c = runner_->model_config();
  EXPECT_EQ(NumSsmLayers(c), 2);
  EXPECT_TRUE(HasAttentionLayers(c));
  EXPECT_EQ(KvLayersPerBlock(c), 2);  // the two attention layers
  EXPECT_EQ(runner_->num_state_slots(), 4);
  EXPECT_EQ(StateSlotBytes(c), 2 * (3 * (128 + 2 * 16) + 4 * 32 * 16) * int64_t{sizeof(float)});
}

TEST_F(HybridTest, ChunksAndBatchesGiveTheLogitsOfOneStep) {
  std::vector<int32_t> prompt(45);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  const std::vector<float> whole = Logits(prompt, prompt.size(), 0, 0);
  ASSERT_FALSE(whole.empty());
  for (float v : whole) ASSERT_TRUE(std::isfinite(v));
  const auto [low, high] = std::minmax_element(whole.begin(), whole.end());
  EXPECT_GT(*high - *low, 0.1f) << "dummy weights should give logits that differ";
  for (size_t chunk : {1, 7, 16}) {
    const std::vector<float> chunked = Logits(prompt, chunk, 3, 8);
    ASSERT_EQ(chunked.size(), whole.size());
    const double error = testing::ScaledError(chunked, whole);
    std::printf("[ chunks   ] of %2zu: scaled max |logit - one step's| %.3g (logits in [%.3g, %.3g])\n",
                chunk, error, *low, *high);
    EXPECT_LE(error, 5e-5) << "chunks of " << chunk;
  }
  // Two sequences in one step (slots 2 and 1, distinct blocks): each as alone.
  const std::vector<int32_t> other(prompt.begin() + 5, prompt.begin() + 30);
  const std::vector<float> other_alone = Logits(other, other.size(), 0, 0);
  std::vector<int32_t> blocks_a(3), blocks_b(2);
  std::iota(blocks_a.begin(), blocks_a.end(), 20);
  std::iota(blocks_b.begin(), blocks_b.end(), 30);
  StepBatch batch;
  batch.AddSequence(prompt, 0, blocks_a, LogitsMode::kAll, 2);
  batch.AddSequence(other, 0, blocks_b, LogitsMode::kAll, 1);
  StepOutput output;
  ASSERT_TRUE(runner_->Execute(batch, &output).ok());
  const size_t split = whole.size();
  ASSERT_EQ(output.logits.size(), split + other_alone.size());
  EXPECT_LE(testing::ScaledError(std::span(output.logits).first(split), whole), 5e-5);
  EXPECT_LE(testing::ScaledError(std::span(output.logits).subspan(split), other_alone), 5e-5);
}

}  // namespace
}  // namespace lmserve::engine
