// lmserve tokenize / detokenize: text <-> token ids with a model's tokenizer, as JSON.

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/cli.h"

namespace lmserve::server {
namespace {

// Token strings may hold any bytes (GGUF): invalid UTF-8 is written as U+FFFD, never an error.
void PrintJson(const nlohmann::json& out) {
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

struct TokenizeOptions {
  std::string tokenizer;
  std::optional<std::string> text;
  std::optional<std::string> text_file;
  bool lines = false;
  bool add_special = false;
  bool pieces = false;
};

int Run(const TokenizeOptions& options) {
  if (options.text.has_value() == options.text_file.has_value()) {
    std::fprintf(stderr, "lmserve tokenize: give exactly one of --text and --text-file\n");
    return 2;
  }
  std::string text = options.text.value_or("");
  if (options.text_file.has_value()) {
    absl::StatusOr<std::string> contents = ReadFile(*options.text_file);
    if (!contents.ok()) {
      std::fprintf(stderr, "lmserve tokenize: --text-file: %s\n",
                   std::string(contents.status().message()).c_str());
      return 1;
    }
    text = *std::move(contents);
  }
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tokenizer =
      engine::Tokenizer::Load(options.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lmserve tokenize: %s\n",
                 std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  if (options.lines) {
    nlohmann::json lines = nlohmann::json::array();
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      lines.push_back(
          (*tokenizer)
              ->Encode(std::string_view(text).substr(start, end - start), options.add_special));
      start = end + 1;
    }
    PrintJson({{"ids", std::move(lines)}});
    return 0;
  }
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, options.add_special);
  nlohmann::json out = {{"ids", ids}};
  if (options.pieces) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const int32_t id : ids) pieces.push_back(std::string((*tokenizer)->IdToPiece(id)));
    out["pieces"] = std::move(pieces);
  }
  PrintJson(out);
  return 0;
}

struct DetokenizeOptions {
  std::string tokenizer;
  std::vector<int32_t> ids;
  bool skip_special = false;
};

int Run(const DetokenizeOptions& options) {
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tokenizer =
      engine::Tokenizer::Load(options.tokenizer);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lmserve detokenize: %s\n",
                 std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  for (const int32_t id : options.ids) {
    if (id < 0 || id >= (*tokenizer)->vocab_size()) {
      std::fprintf(stderr, "lmserve detokenize: id %d is outside the vocabulary (size %d)\n", id,
                   (*tokenizer)->vocab_size());
      return 1;
    }
  }
  PrintJson({{"text", (*tokenizer)->Decode(options.ids, options.skip_special)}});
  return 0;
}

constexpr char kTokenizerHelp[] =
    "a tokenizer.json, a Hugging Face model directory or a .gguf file";

}  // namespace

CommandRunner DeclareTokenize(CLI::App* command) {
  command->footer("Prints the token ids of a text as JSON: {\"ids\": [...]}.");
  auto options = std::make_shared<TokenizeOptions>();
  AddStringFlag(command, "--tokenizer", &options->tokenizer, kTokenizerHelp)->required();
  AddStringFlag(command, "--text", &options->text, "the text to tokenize");
  AddStringFlag(command, "--text-file", &options->text_file,
                "tokenize this file's contents instead of --text");
  AddBoolFlag(command, "--lines", &options->lines,
              "with --text-file: tokenize each line on its own; prints {\"ids\": [[...], ...]}");
  AddBoolFlag(command, "--add-special", &options->add_special,
              "add the special tokens the tokenizer adds (e.g. BOS)");
  AddBoolFlag(command, "--pieces", &options->pieces,
              "also print the vocabulary string of each token");
  return [options] { return Run(*options); };
}

CommandRunner DeclareDetokenize(CLI::App* command) {
  command->footer("Prints the text of token ids as JSON: {\"text\": \"...\"}.");
  auto options = std::make_shared<DetokenizeOptions>();
  AddStringFlag(command, "--tokenizer", &options->tokenizer, kTokenizerHelp)->required();
  AddIdListFlag(command, "--ids", &options->ids, "comma-separated token ids, e.g. 1,2,3")
      ->required();
  AddBoolFlag(command, "--skip-special", &options->skip_special, "leave out special tokens");
  return [options] { return Run(*options); };
}

}  // namespace lmserve::server
