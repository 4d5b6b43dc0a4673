// The parts a Tokenizer is assembled from, filled in by the tokenizer.json and GGUF loaders.
// Internal to engine/tokenizer.

#ifndef LMSERVE_ENGINE_TOKENIZER_TOKENIZER_PIPELINE_H_
#define LMSERVE_ENGINE_TOKENIZER_TOKENIZER_PIPELINE_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/tokenizer.h"

namespace lmserve::engine::tokenizer_internal {

struct Pipeline {
  // Stages; all but the model may be null.
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  AddedVocabulary added;

  std::optional<int32_t> bos_id, eos_id, eot_id, pad_id, unk_id;
  std::string chat_template;

  // Derived by FinishTokenizer.
  int32_t vocab_size = 0;
  bool add_bos = false;
  bool add_eos = false;
  std::vector<uint8_t> flags;  // by id: kSpecialFlag | kByteFallbackFlag
};

inline constexpr uint8_t kSpecialFlag = 1;
inline constexpr uint8_t kByteFallbackFlag = 2;

// The vocabulary string of `id` in `pipeline` (an added token's content first, as `tokenizers`
// does), or nullptr.
const std::string* PipelineIdToToken(const Pipeline& pipeline, int32_t id);
// The id of `token` (added tokens first), or nullopt.
std::optional<int32_t> PipelineTokenToId(const Pipeline& pipeline, std::string_view token);
// The first of `candidates` that is a special added token of `pipeline`, or nullopt.
std::optional<int32_t> FindSpecialToken(const Pipeline& pipeline,
                                        std::initializer_list<std::string_view> candidates);
// The well-known end-of-turn tokens, in order of preference.
std::optional<int32_t> FindEndOfTurnToken(const Pipeline& pipeline);

// Builds the pipeline of a tokenizer.json (text) and optional tokenizer_config.json ("" for none).
absl::StatusOr<std::unique_ptr<Pipeline>> HfPipelineFromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json);

// Derives the remaining fields (vocabulary size, token flags, add_bos/add_eos) and wraps the
// pipeline. REQUIRES: pipeline->model is set.
std::unique_ptr<Tokenizer> FinishTokenizer(std::unique_ptr<Pipeline> pipeline);

}  // namespace lmserve::engine::tokenizer_internal

#endif  // LMSERVE_ENGINE_TOKENIZER_TOKENIZER_PIPELINE_H_
