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
#include <vector>

#include "absl/status/status.h"

namespace lmserve::engine {

class Checkpoint;

// A handle to a declared tensor: its index in the WeightPlan. Default-constructed: no tensor (an
// optional tensor the model does not have, such as a bias).
struct Weight {
  int32_t index = -1;
  bool present() const { return index >= 0; }
};

// One checkpoint tensor that makes up rows of a runner tensor.
struct WeightPart {
  std::string name;  // the checkpoint tensor's Hugging Face name
  int64_t rows = 0;  // its outermost dimension: the rows it fills
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

  bool is_matrix() const { return cols > 0; }
  int64_t num_elements() const { return rows * (cols > 0 ? cols : 1); }
  // The checkpoint shape of a part: [rows, cols] or [rows].
  std::vector<int64_t> PartShape(const WeightPart& part) const;
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
