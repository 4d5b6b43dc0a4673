// The tensors a model family declares: what a runner must hold, where each comes from in the
// checkpoint, and how checkpoint tensors fuse into one runner tensor.
//
// A runner tensor (a WeightSpec) is a matrix [rows, cols] or a vector [rows]. It is made of one or
// more checkpoint tensors stacked by rows in order (its parts): the fused QKV projection is q_proj,
// k_proj and v_proj one after another; Phi-3's qkv_proj is one part that is already fused. Every
// runner stores a tensor contiguously in that order, so the family's forward pass and every runner
// agree on the layout without either spelling it twice.
//
// Tensors of one `kind` ("qkv", "o_proj", ...) have the same shape in every layer; a runner may
// treat them alike (the CUDA runner times its GEMM choice once per kind and batch size).

#ifndef LMSERVE_ENGINE_MODEL_WEIGHT_PLAN_H_
#define LMSERVE_ENGINE_MODEL_WEIGHT_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_config.h"

namespace lmserve::engine {

class Checkpoint;

// A handle to a declared tensor: its index in the WeightPlan. Default-constructed: no tensor (an
// optional tensor the model does not have, such as a bias).
struct Weight {
  int32_t index = -1;
  bool present() const { return index >= 0; }
};

// Rows of a checkpoint tensor split by tensor parallelism (Split::kRows): the checkpoint's rows are
// `slices` slices of `rows` rows each, and rank r of N holds slice r * slices / N. slices is N but
// for KV heads when there are fewer than ranks (each rank then holds one of the KV heads, which
// ranks share).
struct RowSlices {
  explicit RowSlices(int64_t rows, int64_t slices = 0) : rows(rows), slices(slices) {}
  int64_t rows = 0;    // the rank's
  int64_t slices = 0;  // 0: the tensor parallel size
};

// One checkpoint tensor that makes up rows of a runner tensor.
struct WeightPart {
  WeightPart(std::string name, int64_t rows, std::vector<RowSlices> segments = {})
      : name(std::move(name)), rows(rows), segments(std::move(segments)) {}
  std::string name;  // the checkpoint tensor's Hugging Face name
  int64_t rows = 0;  // its outermost dimension: the rows it fills
  // Split::kRows: how its rows split, one entry per piece that splits on its own (Phi-3's fused
  // qkv_proj: q, k and v); their rows add up to `rows`. Empty: one piece of N slices.
  std::vector<RowSlices> segments;
  // The checkpoint tensor's shape where it differs from the part's [rows, cols] by unit
  // dimensions (a depthwise conv1d's [channels, 1, kernel]); empty: [rows, cols]. Replicated
  // tensors only.
  std::vector<int64_t> checkpoint_shape;
};

// How tensor parallelism divides a tensor among N ranks (ModelConfig::tensor_parallel_size),
// Megatron's scheme. A description built from a rank's config (ShardModelConfig) declares each
// tensor with the rank's shape; the split says which slice of the checkpoint's tensor that is.
enum class Split : uint8_t {
  kReplicated,  // every rank holds the whole tensor (norms, biases of replicated outputs, routers)
  kRows,        // column-parallel: rank r holds slice r of the rows of every part (of every
                // segment of a fused part); its projection's output is the rank's own features
  kCols,        // row-parallel: rank r holds slice r of the columns; its projection's output is a
                // partial sum, which the runner all-reduces
  kVocab,       // embeddings and LM head: rank r holds vocabulary rows
                // [r * rows, (r + 1) * rows), the last rank's padded with zero rows
};

struct WeightSpec {
  std::string name;    // unique: "model.layers.3.qkv"; for a single part, the part's name
  std::string kind;    // the role, shared by every layer: "qkv", "o_proj", "embed_tokens", ...
  int64_t layer = -1;  // the decoder layer; -1 for tensors outside the layers
  int64_t rows = 0;
  int64_t cols = 0;               // 0 for a vector
  std::vector<WeightPart> parts;  // rows sum to `rows`; empty when tied_to is set
  Weight tied_to;                 // another tensor whose storage this one shares (tied embeddings)
  // Added to every value as it is loaded (Gemma's RMSNorm weights, stored as scale - 1); 0: none.
  float offset = 0;
  Split split = Split::kReplicated;
  int32_t tensor_parallel_size = 1;  // the N of `split` (the describing config's)
  int32_t tensor_parallel_rank = 0;  // the slice this tensor holds
  int64_t vocab_size = 0;            // kVocab: the checkpoint's rows

  bool is_matrix() const { return cols > 0; }
  int64_t num_elements() const { return rows * (cols > 0 ? cols : 1); }
  // The shape of a part as this tensor holds it: [rows, cols] or [rows].
  std::vector<int64_t> PartShape(const WeightPart& part) const;
  // The shape of a part's checkpoint tensor: PartShape, before tensor parallelism's split.
  std::vector<int64_t> CheckpointShape(const WeightPart& part) const;
  // The input width that scales a part's dummy values (LoadFormat::kDummy): cols for a matrix.
  int64_t fan_in() const { return cols > 0 ? cols : rows; }
};

class WeightPlan {
 public:
  // Declares a tensor made of `parts` (stacked by rows). REQUIRES: the parts' rows add up to rows.
  Weight Add(std::string kind, int64_t layer, int64_t rows, int64_t cols,
             std::vector<WeightPart> parts);
  // Declares a tensor that is one checkpoint tensor, `name`, of shape [rows, cols] (or [rows]).
  Weight AddTensor(std::string kind, int64_t layer, std::string name, int64_t rows,
                   int64_t cols = 0);
  // Declares `kind` as another name for `target`'s storage (an lm_head tied to the embeddings).
  Weight AddTied(std::string kind, Weight target);
  // Sets WeightSpec::offset of `weight`.
  void SetOffset(Weight weight, float offset) { specs_[weight.index].offset = offset; }
  // Sets how tensor parallelism of `config`'s size splits `weight` (a no-op at size 1, where
  // every tensor is whole). kVocab: `weight` has VocabShardRows(config) rows.
  void SetSplit(Weight weight, Split split, const ModelConfig& config);

  const WeightSpec& operator[](Weight weight) const { return specs_[weight.index]; }
  const std::vector<WeightSpec>& specs() const { return specs_; }
  int32_t size() const { return static_cast<int32_t>(specs_.size()); }
  // Every tensor of `kind`, in declaration (layer) order.
  std::vector<Weight> OfKind(const std::string& kind) const;
  // The tensor that storage of `weight` lives in: tied_to where set, else itself.
  Weight Storage(Weight weight) const;

  // Checks that `checkpoint` holds every part with its shape and a supported element type
  // (the checkpoint may list more tensors). Errors name the file and the tensor.
  absl::Status Validate(const Checkpoint& checkpoint) const;

 private:
  std::vector<WeightSpec> specs_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_WEIGHT_PLAN_H_
