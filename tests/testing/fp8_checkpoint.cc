#include "tests/testing/fp8_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/safetensors.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"

namespace lmserve::testing {
namespace {

using kernels::DType;

bool IsLinearWeight(const std::string& name) {
  const std::string suffix = "_proj.weight";
  return name.find(".layers.") != std::string::npos && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

template <typename T>
std::span<const std::byte> Bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// Quantizes `values` [rows, cols] with one scale per block of block_rows x block_cols (the
// quantizer of llm-compressor and of DeepSeek's reference: scale = amax / 448, q = E4M3(v /
// scale)).
void QuantizeBlocks(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t br,
                    int64_t bc, std::vector<uint8_t>* q, std::vector<float>* scales) {
  const int64_t scale_rows = (rows + br - 1) / br, scale_cols = (cols + bc - 1) / bc;
  q->assign(static_cast<size_t>(rows * cols), 0);
  scales->assign(static_cast<size_t>(scale_rows * scale_cols), 1.0f);
  for (int64_t sr = 0; sr < scale_rows; ++sr) {
    for (int64_t sc = 0; sc < scale_cols; ++sc) {
      float amax = 0;
      for (int64_t r = sr * br; r < std::min(rows, (sr + 1) * br); ++r) {
        for (int64_t c = sc * bc; c < std::min(cols, (sc + 1) * bc); ++c) {
          amax = std::max(amax, std::fabs(values[r * cols + c]));
        }
      }
      const float scale = amax > 0 ? amax / kernels::kF8E4M3Max : 1.0f;
      (*scales)[sr * scale_cols + sc] = scale;
      for (int64_t r = sr * br; r < std::min(rows, (sr + 1) * br); ++r) {
        for (int64_t c = sc * bc; c < std::min(cols, (sc + 1) * bc); ++c) {
          (*q)[r * cols + c] = kernels::F32ToF8E4M3(values[r * cols + c] / scale);
        }
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::string> WriteFp8Checkpoint(const std::string& fixture_dir,
                                               Fp8CheckpointLayout layout, int64_t block_rows,
                                               int64_t block_cols, bool quantize_experts,
                                               float kv_scale) {
  namespace fs = std::filesystem;
  static int count = 0;
  const std::string dir = StrCat(TempDir(), "/fp8-", count++);
  fs::create_directories(dir);
  std::ifstream config_in(fixture_dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(config_in, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return absl::InvalidArgumentError(fixture_dir + ": bad config.json");
  switch (layout) {
    case Fp8CheckpointLayout::kCompressedTensorsChannel:
    case Fp8CheckpointLayout::kCompressedTensorsTensor: {
      const bool channel = layout == Fp8CheckpointLayout::kCompressedTensorsChannel;
      config["quantization_config"] = {
          {"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"ignore", {"lm_head"}},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights",
               {{"num_bits", 8},
                {"type", "float"},
                {"strategy", channel ? "channel" : "tensor"},
                {"symmetric", true},
                {"dynamic", false}}},
              {"input_activations",
               {{"num_bits", 8},
                {"type", "float"},
                {"strategy", channel ? "token" : "tensor"},
                {"dynamic", channel}}}}}}}};
      break;
    }
    case Fp8CheckpointLayout::kBlockWise:
      config["quantization_config"] = {{"quant_method", "fp8"},
                                       {"fmt", "e4m3"},
                                       {"activation_scheme", "dynamic"},
                                       {"weight_block_size", {block_rows, block_cols}}};
      break;
  }
  const int64_t num_layers = config.value("num_hidden_layers", int64_t{0});
  if (kv_scale > 0) {
    config["quantization_config"]["kv_cache_scheme"] = {
        {"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false},
        {"symmetric", true}};
  }
  std::ofstream(dir + "/config.json") << config.dump(2);

  LMSERVE_ASSIGN_OR_RETURN(auto file,
                           engine::SafetensorsFile::Open(fixture_dir + "/model.safetensors"));
  // Storage for every tensor written (the spans point into it).
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<uint16_t>> halves;
  bytes.reserve(file->tensors().size());
  floats.reserve(2 * file->tensors().size() + 2 * static_cast<size_t>(num_layers));
  halves.reserve(file->tensors().size());
  std::vector<engine::TensorToWrite> out;
  for (const auto& [name, view] : file->tensors()) {
    const bool expert = name.find(".experts.") != std::string::npos;
    if (!IsLinearWeight(name) || view.shape.size() != 2 || (expert && !quantize_experts)) {
      out.push_back({name, view.dtype, view.shape,
                     std::span<const std::byte>(view.data, static_cast<size_t>(view.num_bytes))});
      continue;
    }
    const int64_t rows = view.shape[0], cols = view.shape[1];
    LMSERVE_ASSIGN_OR_RETURN(std::vector<float> values, file->ReadF32(name));
    std::vector<uint8_t>& q = bytes.emplace_back();
    std::vector<float>& scales = floats.emplace_back();
    const std::string prefix = name.substr(0, name.size() - std::string("weight").size());
    switch (layout) {
      case Fp8CheckpointLayout::kCompressedTensorsChannel: {
        QuantizeBlocks(values, rows, cols, 1, cols, &q, &scales);
        std::vector<uint16_t>& bf16 = halves.emplace_back();
        for (float s : scales) bf16.push_back(kernels::F32ToBf16(s));
        out.push_back({name, DType::kF8E4M3, view.shape, Bytes(q)});
        out.push_back({prefix + "weight_scale", DType::kBF16, {rows, 1}, Bytes(bf16)});
        break;
      }
      case Fp8CheckpointLayout::kCompressedTensorsTensor: {
        QuantizeBlocks(values, rows, cols, rows, cols, &q, &scales);
        out.push_back({name, DType::kF8E4M3, view.shape, Bytes(q)});
        out.push_back({prefix + "weight_scale", DType::kF32, {}, Bytes(scales)});
        std::vector<float>& input_scale = floats.emplace_back(1, 0.25f);  // static; unused
        out.push_back({prefix + "input_scale", DType::kF32, {}, Bytes(input_scale)});
        break;
      }
      case Fp8CheckpointLayout::kBlockWise: {
        QuantizeBlocks(values, rows, cols, block_rows, block_cols, &q, &scales);
        out.push_back({name, DType::kF8E4M3, view.shape, Bytes(q)});
        out.push_back({prefix + "weight_scale_inv",
                       DType::kF32,
                       {(rows + block_rows - 1) / block_rows, (cols + block_cols - 1) / block_cols},
                       Bytes(scales)});
        break;
      }
    }
  }
  if (kv_scale > 0) {
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      for (bool value : {false, true}) {
        std::vector<float>& scale =
            floats.emplace_back(1, KvCacheScaleForTest(kv_scale, layer, value));
        out.push_back({StrCat("model.layers.", layer, ".self_attn.", value ? "v" : "k", "_scale"),
                       DType::kF32,
                       {},
                       Bytes(scale)});
      }
    }
  }
  LMSERVE_RETURN_IF_ERROR(engine::WriteSafetensors(dir + "/model.safetensors", out));
  return dir;
}

void QuantizedAccuracy::Add(std::span<const float> got, std::span<const float> want,
                            int64_t vocab) {
  const int64_t num_rows = static_cast<int64_t>(want.size()) / vocab;
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* g = got.data() + r * vocab;
    const float* w = want.data() + r * vocab;
    double sum = 0, sum_sq = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double d = double{g[v]} - w[v];
      squared_error += d * d;
      squared_reference += double{w[v]} * w[v];
      sum += w[v];
      sum_sq += double{w[v]} * w[v];
    }
    const double mean = sum / static_cast<double>(vocab);
    const double stddev = std::sqrt(std::max(0.0, sum_sq / static_cast<double>(vocab) - mean * mean));
    const int64_t top = std::max_element(w, w + vocab) - w;
    double second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      if (v != top) second = std::max(second, double{w[v]});
    }
    ++rows;
    if (double{w[top]} - second > 0.1 * stddev) {
      ++decisive_rows;
      if (std::max_element(g, g + vocab) - g == top) ++decisive_agree;
    }
  }
}

double QuantizedAccuracy::relative_l2() const {
  return squared_reference > 0 ? std::sqrt(squared_error / squared_reference) : 0.0;
}

double QuantizedAccuracy::top1_agreement() const {
  return decisive_rows > 0 ? static_cast<double>(decisive_agree) / decisive_rows : 1.0;
}

}  // namespace lmserve::testing
