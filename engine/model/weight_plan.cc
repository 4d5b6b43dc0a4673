#include "engine/model/weight_plan.h"

#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/core/check.h"
#include "engine/model/checkpoint.h"

namespace lmserve::engine {

std::vector<int64_t> WeightSpec::PartShape(const WeightPart& part) const {
  if (cols > 0) return {part.rows, cols};
  return {part.rows};
}

std::vector<int64_t> WeightSpec::CheckpointShape(const WeightPart& part) const {
  if (!part.checkpoint_shape.empty()) return part.checkpoint_shape;
  const int64_t n = tensor_parallel_size;
  switch (split) {
    case Split::kReplicated:
      break;
    case Split::kRows: {
      int64_t rows = part.segments.empty() ? part.rows * n : 0;
      for (const RowSlices& segment : part.segments) {
        rows += segment.rows * (segment.slices > 0 ? segment.slices : n);
      }
      return cols > 0 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
    }
    case Split::kCols:
      return {part.rows, cols * n};
    case Split::kVocab:
      return cols > 0 ? std::vector<int64_t>{vocab_size, cols} : std::vector<int64_t>{vocab_size};
  }
  return PartShape(part);
}

void WeightPlan::SetSplit(Weight weight, Split split, const ModelConfig& config) {
  WeightSpec& spec = specs_[weight.index];
  LMSERVE_CORE_CHECK(!spec.tied_to.present(), "SetSplit on tied tensor ", spec.name);
  LMSERVE_CORE_CHECK(split != Split::kCols || spec.cols > 0, "a kCols split of vector ", spec.name);
  spec.split = split;
  spec.tensor_parallel_size = config.tensor_parallel_size;
  spec.tensor_parallel_rank = config.tensor_parallel_rank;
  if (split == Split::kVocab) {
    LMSERVE_CORE_CHECK(spec.rows == VocabShardRows(config) && spec.parts.size() == 1,
                       "a kVocab split of ", spec.name, " with ", spec.rows, " rows");
    spec.vocab_size = config.vocab_size;
  }
}

Weight WeightPlan::Add(std::string kind, int64_t layer, int64_t rows, int64_t cols,
                       std::vector<WeightPart> parts) {
  int64_t part_rows = 0;
  for (const WeightPart& part : parts) part_rows += part.rows;
  LMSERVE_CORE_CHECK(part_rows == rows && !parts.empty(), "weight ", kind, " of layer ", layer,
                     ": parts hold ", part_rows, " rows of ", rows);
  WeightSpec spec;
  spec.name =
      parts.size() == 1 ? parts[0].name : (layer >= 0 ? LayerTensorName(layer, kind) : kind);
  spec.kind = std::move(kind);
  spec.layer = layer;
  spec.rows = rows;
  spec.cols = cols;
  spec.parts = std::move(parts);
  specs_.push_back(std::move(spec));
  return Weight{static_cast<int32_t>(specs_.size() - 1)};
}

Weight WeightPlan::AddTensor(std::string kind, int64_t layer, std::string name, int64_t rows,
                             int64_t cols) {
  return Add(std::move(kind), layer, rows, cols, {WeightPart{std::move(name), rows}});
}

Weight WeightPlan::AddTied(std::string kind, Weight target) {
  const WeightSpec& storage = (*this)[Storage(target)];
  WeightSpec spec;
  spec.name = kind;
  spec.kind = std::move(kind);
  spec.rows = storage.rows;
  spec.cols = storage.cols;
  spec.tied_to = Storage(target);
  spec.split = storage.split;
  spec.tensor_parallel_size = storage.tensor_parallel_size;
  spec.tensor_parallel_rank = storage.tensor_parallel_rank;
  spec.vocab_size = storage.vocab_size;
  specs_.push_back(std::move(spec));
  return Weight{static_cast<int32_t>(specs_.size() - 1)};
}

std::vector<Weight> WeightPlan::OfKind(const std::string& kind) const {
  std::vector<Weight> out;
  for (int32_t i = 0; i < size(); ++i) {
    if (specs_[i].kind == kind) out.push_back(Weight{i});
  }
  return out;
}

Weight WeightPlan::Storage(Weight weight) const {
  const WeightSpec& spec = (*this)[weight];
  return spec.tied_to.present() ? spec.tied_to : weight;
}

absl::Status WeightPlan::Validate(const Checkpoint& checkpoint) const {
  for (const WeightSpec& spec : specs_) {
    for (const WeightPart& part : spec.parts) {
      LMSERVE_ASSIGN_OR_RETURN(const TensorView* tensor,
                               checkpoint.Get(part.name, spec.CheckpointShape(part)));
      LMSERVE_RETURN_IF_ERROR(CheckTensorBytes(*tensor));
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::engine
