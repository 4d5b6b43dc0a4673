#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/model/checkpoint.h"
#include "engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"

namespace lmserve::engine {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(HfCheckpointTest, LoadsEveryFixtureModel) {
  for (const std::string& name : testing::HfTinyModelNames()) {
    auto checkpoint = OpenCheckpoint(testing::HfTinyDir(name));
    ASSERT_TRUE(checkpoint.ok()) << name << ": " << checkpoint.status();
    EXPECT_EQ((*checkpoint)->format(), CheckpointFormat::kSafetensors);
    EXPECT_EQ((*checkpoint)->config().vocab_size, 1024);
    auto embed = (*checkpoint)->Find("model.embed_tokens.weight");
    ASSERT_TRUE(embed.ok());
    EXPECT_EQ((*embed)->dtype, kernels::DType::kBF16);
  }
}

TEST(HfCheckpointTest, ReadsGqaLlama3AndQwenConfigs) {
  auto mqa = OpenCheckpoint(testing::HfTinyDir("llama-mqa-tied-llama3rope"));
  ASSERT_TRUE(mqa.ok()) << mqa.status();
  const ModelConfig& c = (*mqa)->config();
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.scaling, RopeScaling::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 128);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);

  auto qwen = OpenCheckpoint(testing::HfTinyDir("qwen2-bias"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ((*qwen)->config().family, "qwen2");
  EXPECT_TRUE((*qwen)->config().attention_bias);
  EXPECT_TRUE((*qwen)->Find("model.layers.0.self_attn.q_proj.bias").ok());
}

TEST(HfCheckpointTest, Llama3RopeMatchesTransformersFormula) {
  // Hand-evaluated from transformers' _compute_llama3_parameters for theta 500000, head_dim 64,
  // factor 8, low 1, high 4, original context 128: wavelengths below 32 stay, above 128 are
  // divided by 8, between are blended.
  ModelConfig c;
  c.head_dim = 64;
  c.rope.theta = 500000;
  c.rope.scaling = RopeScaling::kLlama3;
  c.rope.factor = 8;
  c.rope.original_max_position_embeddings = 128;
  const std::vector<double> f = RopeInverseFrequencies(c.rope, c.head_dim);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);  // wavelength 2*pi < 32: unchanged
  const double base = 1.0 / std::pow(500000.0, 20.0 / 64.0);  // i = 10
  const double wavelen = 2 * M_PI / base;
  ASSERT_GT(wavelen, 128.0);
  EXPECT_DOUBLE_EQ(f[10], base / 8);
  const double base4 = 1.0 / std::pow(500000.0, 8.0 / 64.0);  // i = 4: wavelength ~ 43, blended
  const double wl4 = 2 * M_PI / base4;
  ASSERT_GT(wl4, 32.0);
  ASSERT_LT(wl4, 128.0);
  const double smooth = (128.0 / wl4 - 1.0) / 3.0;
  EXPECT_DOUBLE_EQ(f[4], (1 - smooth) * base4 / 8 + smooth * base4);
}

// Copies a fixture model into a scratch directory so that a test can damage it.
fs::path CopyFixture(const std::string& name, const std::string& as) {
  fs::path dir = fs::path(testing::TempDir()) / as;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(testing::HfTinyDir(name))) {
    fs::copy_file(entry.path(), dir / entry.path().filename());
    fs::permissions(dir / entry.path().filename(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dir;
}

TEST(HfCheckpointTest, TruncatedFileIsAClearError) {
  fs::path dir = CopyFixture("llama-gqa", "truncated");
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 100);
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("truncated"));
}

// Mamba-2 (state-space layers only): its shape from Mamba2Config's keys, and a config.json as
// Python's json.dumps writes it, with a bare Infinity in time_step_limit.
TEST(HfCheckpointTest, ReadsAMamba2ConfigWithPythonsInfinity) {
  const fs::path dir = fs::path(testing::TempDir()) / "mamba2-infinity";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fixture = testing::HfFamilyDir("mamba2-ssm");
  fs::copy_file(fixture / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(fixture / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"chunk_size\": 32,";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(),
               key + " \"time_step_limit\": [0.0, Infinity], \"_name_or_path\": \"NaN Infinity\",");
  std::ofstream(dir / "config.json") << text;
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const ModelConfig& c = (*checkpoint)->config();
  EXPECT_EQ(c.family, "mamba2");
  EXPECT_EQ(c.name, "NaN Infinity");  // inside a string: left alone
  EXPECT_EQ(c.num_attention_heads, 0);
  EXPECT_EQ(c.ssm.num_heads, 8);
  EXPECT_EQ(c.ssm.head_dim, 32);
  EXPECT_EQ(c.ssm.state_size, 16);
  EXPECT_EQ(c.ssm.n_groups, 1);
  EXPECT_EQ(c.ssm.conv_kernel, 4);
  EXPECT_EQ(c.ssm.chunk_size, 32);
  EXPECT_EQ(c.ssm.time_step_max, 0.0);  // no upper limit
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);  // layer_norm_epsilon, not rms_norm_eps
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(NumSsmLayers(c), 2);
  EXPECT_FALSE(HasAttentionLayers(c));
}

TEST(HfCheckpointTest, InconsistentMamba2ShapesAreRefused) {
  const fs::path dir = fs::path(testing::TempDir()) / "mamba2-bad";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fixture = testing::HfFamilyDir("mamba2-ssm");
  fs::copy_file(fixture / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(fixture / "config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"num_heads\": 8,";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"num_heads\": 6,");  // 6 x 32 is not 2 x 128
  std::ofstream(dir / "config.json") << text;
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("expand"));
}

TEST(HfCheckpointTest, CorruptHeaderIsAClearError) {
  fs::path dir = CopyFixture("llama-gqa", "corrupt");
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.write("\x01\x02\x03", 3);
  }
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("corrupt safetensors"));
}

TEST(HfCheckpointTest, UnsupportedArchitectureIsAClearError) {
  fs::path dir = CopyFixture("llama-gqa", "gemma");
  {
    std::ofstream f(dir / "config.json");
    f << R"({"architectures": ["GemmaForCausalLM"], "vocab_size": 1024})";
  }
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("GemmaForCausalLM"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("config.json"));
}

TEST(HfCheckpointTest, MissingTensorAndShapeMismatchNameTheTensor) {
  // Rewrite the fixture's weights without one tensor, and with another reshaped.
  fs::path dir = CopyFixture("llama-gqa", "missing");
  auto original = SafetensorsFile::Open(testing::HfTinyDir("llama-gqa") + "/model.safetensors");
  ASSERT_TRUE(original.ok());
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, view] : (*original)->tensors()) {
    if (name == "model.layers.1.mlp.up_proj.weight") continue;
    tensors.push_back({name, view.dtype, view.shape, {view.data, static_cast<size_t>(view.num_bytes)}});
  }
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));

  for (TensorToWrite& t : tensors) {
    if (t.name == "model.norm.weight") t.shape = {1, t.shape[0]};
  }
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  checkpoint = OpenCheckpoint(dir.string());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("model.norm.weight"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("shape"));
}

TEST(HfCheckpointTest, ShardedCheckpointLoads) {
  fs::path dir = CopyFixture("qwen2-bias", "sharded");
  auto original = SafetensorsFile::Open(testing::HfTinyDir("qwen2-bias") + "/model.safetensors");
  ASSERT_TRUE(original.ok());
  std::vector<TensorToWrite> shard[2];
  std::string index = R"({"metadata": {}, "weight_map": {)";
  int i = 0;
  for (const auto& [name, view] : (*original)->tensors()) {
    const int s = i++ % 2;
    shard[s].push_back({name, view.dtype, view.shape, {view.data, static_cast<size_t>(view.num_bytes)}});
    index += (i > 1 ? "," : "") + ("\"" + name + "\": \"model-0000" + std::to_string(s + 1) +
                                   "-of-00002.safetensors\"");
  }
  index += "}}";
  fs::remove(dir / "model.safetensors");
  ASSERT_TRUE(WriteSafetensors((dir / "model-00001-of-00002.safetensors").string(), shard[0]).ok());
  ASSERT_TRUE(WriteSafetensors((dir / "model-00002-of-00002.safetensors").string(), shard[1]).ok());
  std::ofstream(dir / "model.safetensors.index.json") << index;
  auto checkpoint = OpenCheckpoint(dir.string());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->tensors().size(), (*original)->tensors().size());
  for (const auto& [name, view] : (*original)->tensors()) {
    auto loaded = (*checkpoint)->Find(name);
    ASSERT_TRUE(loaded.ok()) << name;
    ASSERT_EQ((*loaded)->num_bytes, view.num_bytes);
    EXPECT_EQ(std::memcmp((*loaded)->data, view.data, view.num_bytes), 0) << name;
  }
}

}  // namespace
}  // namespace lmserve::engine
