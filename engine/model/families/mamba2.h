// Mamba-2 (Mamba2ForCausalLM): a decoder of state-space layers, no attention. Each layer is a
// pre-norm residual block around a mixer: in_proj, the causal depthwise conv1d with its rolling
// state, the SSD scan with its recurrent state, the gated RMSNorm and out_proj (ForwardOps'
// SsmConv, SsmScan, GatedRmsNorm; SsmLayer in ops.h).
//
// A hybrid model (attention and Mamba layers: Jamba, Nemotron-H, Granite 4) is one description
// away: DeclareSsmMixer declares a layer's mixer and ForwardSsmMixer runs it, beside the attention
// parts of llama.h; ModelConfig::ssm_layers says which layers are which.

#ifndef LMSERVE_ENGINE_MODEL_FAMILIES_MAMBA2_H_
#define LMSERVE_ENGINE_MODEL_FAMILIES_MAMBA2_H_

#include <cstdint>
#include <string>

#include "engine/model/family.h"

namespace lmserve::engine {

// One layer's mixer tensors and attributes.
struct SsmMixer {
  Weight in_proj;   // [in_proj_dim, hidden]: z, x B C, dt
  Weight out_proj;  // [hidden, inner]
  SsmLayer ssm;
};

// Declares the mixer of decoder layer `layer`, the `state_layer`-th state-space layer, whose
// Hugging Face tensors are named `prefix` + "in_proj.weight", "conv1d.weight", ... (Mamba-2:
// "backbone.layers.L.mixer.").
SsmMixer DeclareSsmMixer(WeightPlan& plan, const ModelConfig& config, int64_t layer,
                         int64_t state_layer, const std::string& prefix);

// The mixer over `in` (a normed [hidden] buffer) into `out` ([hidden]): in_proj, conv, scan,
// gated norm, out_proj, through the kSsm* buffers.
absl::Status ForwardSsmMixer(ForwardOps& ops, const SsmMixer& mixer, Buffer in, Buffer out);

ModelFamily Mamba2Family();

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_FAMILIES_MAMBA2_H_
