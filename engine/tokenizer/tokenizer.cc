#include "engine/tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <utility>

#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "engine/tokenizer/tokenizer_pipeline.h"
#include "engine/tokenizer/unicode.h"

namespace lmserve::engine {
namespace {

namespace fs = std::filesystem;
using tokenizer_internal::AddedToken;
using tokenizer_internal::AddedVocabulary;
using tokenizer_internal::Pipeline;

bool HasGgufMagic(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

absl::Status Annotate(const absl::Status& status, std::string_view context) {
  return absl::Status(status.code(), StrCat(context, ": ", status.message()));
}

}  // namespace

namespace tokenizer_internal {

const std::string* PipelineIdToToken(const Pipeline& pipeline, int32_t id) {
  if (const AddedToken* added = pipeline.added.Find(id); added != nullptr) return &added->piece;
  return pipeline.model->IdToToken(id);
}

std::optional<int32_t> PipelineTokenToId(const Pipeline& pipeline, std::string_view token) {
  if (const int32_t id = pipeline.added.IdOf(token); id >= 0) return id;
  if (const int32_t id = pipeline.model->TokenToId(token); id >= 0) return id;
  return std::nullopt;
}

std::optional<int32_t> FindSpecialToken(const Pipeline& pipeline,
                                        std::initializer_list<std::string_view> candidates) {
  for (const std::string_view candidate : candidates) {
    const int32_t id = pipeline.added.IdOf(candidate);
    if (id >= 0 && pipeline.added.Find(id)->special) return id;
  }
  return std::nullopt;
}

std::optional<int32_t> FindEndOfTurnToken(const Pipeline& pipeline) {
  // llama.cpp's list of end-of-turn tokens.
  return FindSpecialToken(pipeline, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                     "<|endoftext|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>"});
}

std::unique_ptr<Tokenizer> FinishTokenizer(std::unique_ptr<Pipeline> pipeline) {
  int32_t vocab_size = pipeline->model->vocab_size();
  for (const AddedToken& token : pipeline->added.tokens()) {
    vocab_size = std::max(vocab_size, token.id + 1);
  }
  pipeline->vocab_size = vocab_size;
  pipeline->flags.assign(vocab_size, 0);
  for (int32_t id = 0; id < vocab_size; ++id) {
    const AddedToken* added = pipeline->added.Find(id);
    if (added != nullptr) {
      if (added->special) pipeline->flags[id] |= kSpecialFlag;
      continue;
    }
    const std::string* token = pipeline->model->IdToToken(id);
    if (token != nullptr && ByteFallbackValue(*token) >= 0) {
      pipeline->flags[id] |= kByteFallbackFlag;
    }
  }
  // What the post-processor puts around a sequence.
  if (pipeline->post_processor != nullptr) {
    constexpr int32_t kSentinel = -7;
    std::vector<int32_t> probe = {kSentinel};
    pipeline->post_processor->Process(&probe);
    const auto sentinel = std::find(probe.begin(), probe.end(), kSentinel);
    if (pipeline->bos_id.has_value()) {
      pipeline->add_bos = std::find(probe.begin(), sentinel, *pipeline->bos_id) != sentinel;
    }
    if (pipeline->eos_id.has_value() && sentinel != probe.end()) {
      pipeline->add_eos = std::find(sentinel + 1, probe.end(), *pipeline->eos_id) != probe.end();
    }
  }
  return std::make_unique<Tokenizer>(std::move(pipeline));
}

}  // namespace tokenizer_internal

Tokenizer::Tokenizer(std::unique_ptr<const Pipeline> pipeline) : pipeline_(std::move(pipeline)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path_string) {
  const fs::path path(path_string);
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json_path = path / "tokenizer.json";
    if (!fs::exists(json_path, ec)) {
      return absl::NotFoundError(
          StrCat(path_string,
                 ": no tokenizer.json in this directory (only tokenizer.json-based "
                 "Hugging Face tokenizers are supported)"));
    }
    LMSERVE_ASSIGN_OR_RETURN(std::string json, lmserve::ReadFile(json_path.string()));
    std::string config;
    if (fs::exists(path / "tokenizer_config.json", ec)) {
      LMSERVE_ASSIGN_OR_RETURN(std::string read,
                               lmserve::ReadFile((path / "tokenizer_config.json").string()));
      config = std::move(read);
    }
    absl::StatusOr<std::unique_ptr<Pipeline>> pipeline =
        tokenizer_internal::HfPipelineFromJson(json, config);
    if (!pipeline.ok()) return Annotate(pipeline.status(), json_path.string());
    // transformers >= 4.43 may keep the template in its own file; it wins over the config's.
    if (fs::exists(path / "chat_template.jinja", ec)) {
      LMSERVE_ASSIGN_OR_RETURN(std::string chat_template,
                               lmserve::ReadFile((path / "chat_template.jinja").string()));
      (*pipeline)->chat_template = std::move(chat_template);
    }
    std::unique_ptr<Tokenizer> tokenizer =
        tokenizer_internal::FinishTokenizer(*std::move(pipeline));
    return tokenizer;
  }
  if (!fs::exists(path, ec)) return absl::NotFoundError(StrCat(path_string, ": no such file"));
  if (path.extension() == ".gguf" || HasGgufMagic(path)) {
    LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path_string));
    LMSERVE_ASSIGN_OR_RETURN(GgufTokenizerData data, GgufTokenizerDataFromFile(*file));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = FromGguf(data);
    if (!tokenizer.ok()) return Annotate(tokenizer.status(), path_string);
    return tokenizer;
  }
  LMSERVE_ASSIGN_OR_RETURN(std::string json, lmserve::ReadFile(path.string()));
  std::string config;
  const fs::path config_path = path.parent_path() / "tokenizer_config.json";
  if (path.filename() == "tokenizer.json" && fs::exists(config_path, ec)) {
    LMSERVE_ASSIGN_OR_RETURN(std::string read, lmserve::ReadFile(config_path.string()));
    config = std::move(read);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = FromHfJson(json, config);
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), path_string);
  return tokenizer;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view raw_text, bool add_special) const {
  const Pipeline& p = *pipeline_;
  std::string sanitized;
  std::string_view text = raw_text;
  if (!IsValidUtf8(text)) {
    sanitized = tokenizer_internal::Utf8Lossy(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<AddedVocabulary::Segment> raw_segments, normalized_segments;
  std::vector<std::string> words;
  std::string normalized;
  p.added.Split(text, /*normalized_set=*/false, &raw_segments);
  for (const AddedVocabulary::Segment& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const bool raw_starts_text = raw.text.data() == text.data();
    normalized.assign(raw.text);
    if (p.normalizer != nullptr) p.normalizer->Normalize(&normalized);
    if (normalized.empty()) continue;
    normalized_segments.clear();
    if (p.added.HasTokens(/*normalized_set=*/true)) {
      p.added.Split(normalized, /*normalized_set=*/true, &normalized_segments);
    } else {
      normalized_segments.push_back({-1, normalized});
    }
    for (const AddedVocabulary::Segment& segment : normalized_segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      words.assign(1, std::string(segment.text));
      bool starts_text = raw_starts_text && segment.text.data() == normalized.data();
      if (p.pre_tokenizer != nullptr) p.pre_tokenizer->PreTokenize(&words, &starts_text);
      for (const std::string& word : words) p.model->Tokenize(word, &ids);
    }
  }
  if (add_special && p.post_processor != nullptr) p.post_processor->Process(&ids);
  return ids;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  const Pipeline& p = *pipeline_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    const std::string* token = tokenizer_internal::PipelineIdToToken(p, id);
    if (token != nullptr) tokens.push_back(*token);
  }
  std::string text;
  if (p.decoder != nullptr) {
    p.decoder->DecodeChain(&tokens);
    text = StrJoin(tokens, "");
  } else {
    text = StrJoin(tokens, " ");
  }
  // Raw GGUF strings may hold any bytes.
  if (!IsValidUtf8(text)) text = tokenizer_internal::Utf8Lossy(text);
  return text;
}

int32_t Tokenizer::vocab_size() const { return pipeline_->vocab_size; }

std::string_view Tokenizer::IdToPiece(int32_t id) const {
  const std::string* token = tokenizer_internal::PipelineIdToToken(*pipeline_, id);
  return token == nullptr ? std::string_view() : std::string_view(*token);
}

std::optional<int32_t> Tokenizer::PieceToId(std::string_view piece) const {
  return tokenizer_internal::PipelineTokenToId(*pipeline_, piece);
}

std::optional<int32_t> Tokenizer::bos_id() const { return pipeline_->bos_id; }
std::optional<int32_t> Tokenizer::eos_id() const { return pipeline_->eos_id; }
std::optional<int32_t> Tokenizer::eot_id() const { return pipeline_->eot_id; }
std::optional<int32_t> Tokenizer::pad_id() const { return pipeline_->pad_id; }
std::optional<int32_t> Tokenizer::unk_id() const { return pipeline_->unk_id; }

std::string Tokenizer::bos_token() const {
  return bos_id().has_value() ? std::string(IdToPiece(*bos_id())) : std::string();
}
std::string Tokenizer::eos_token() const {
  return eos_id().has_value() ? std::string(IdToPiece(*eos_id())) : std::string();
}
bool Tokenizer::add_bos() const { return pipeline_->add_bos; }
bool Tokenizer::add_eos() const { return pipeline_->add_eos; }

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < pipeline_->vocab_size &&
         (pipeline_->flags[id] & tokenizer_internal::kSpecialFlag) != 0;
}

bool Tokenizer::IsByteFallback(int32_t id) const {
  return id >= 0 && id < pipeline_->vocab_size &&
         (pipeline_->flags[id] & tokenizer_internal::kByteFallbackFlag) != 0;
}

const std::string& Tokenizer::chat_template() const { return pipeline_->chat_template; }

}  // namespace lmserve::engine
