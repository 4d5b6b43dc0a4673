// lmserve tokenize / detokenize: text <-> token ids with a model's tokenizer, as JSON.

#include <cstdio>
#include <string>

#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/args.h"
#include "server/cli.h"

namespace lmserve::server {
namespace {

// Parses the options; returns the exit code to stop with, or -1 to go on.
int ParseOrExit(Args& args, int argc, char** argv) {
  absl::StatusOr<bool> parsed = args.Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  return *parsed ? -1 : 0;
}

absl::StatusOr<std::unique_ptr<engine::Tokenizer>> LoadTokenizer(const Args& args) {
  return engine::Tokenizer::Load(args.Get("tokenizer"));
}

// Token strings may hold any bytes (GGUF): invalid UTF-8 is written as U+FFFD, never an error.
void PrintJson(const nlohmann::json& out) {
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  Args args("tokenize", "Prints the token ids of a text as JSON: {\"ids\": [...]}.");
  args.Required("tokenizer", "a tokenizer.json, a Hugging Face model directory or a .gguf file")
      .Required("text", "the text to tokenize")
      .Flag("add-special", "add the special tokens the tokenizer adds (e.g. BOS)")
      .Flag("pieces", "also print the vocabulary string of each token");
  if (const int code = ParseOrExit(args, argc, argv); code >= 0) return code;
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tokenizer = LoadTokenizer(args);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lmserve tokenize: %s\n",
                 std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  const std::vector<int32_t> ids =
      (*tokenizer)->Encode(args.Get("text"), args.GetFlag("add-special"));
  nlohmann::json out = {{"ids", ids}};
  if (args.GetFlag("pieces")) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const int32_t id : ids) pieces.push_back(std::string((*tokenizer)->IdToPiece(id)));
    out["pieces"] = std::move(pieces);
  }
  PrintJson(out);
  return 0;
}

int RunDetokenize(int argc, char** argv) {
  Args args("detokenize", "Prints the text of token ids as JSON: {\"text\": \"...\"}.");
  args.Required("tokenizer", "a tokenizer.json, a Hugging Face model directory or a .gguf file")
      .Required("ids", "comma-separated token ids, e.g. 1,2,3")
      .Flag("skip-special", "leave out special tokens");
  if (const int code = ParseOrExit(args, argc, argv); code >= 0) return code;
  absl::StatusOr<std::vector<int32_t>> ids = args.GetIntList("ids");
  if (!ids.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ids.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tokenizer = LoadTokenizer(args);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "lmserve detokenize: %s\n",
                 std::string(tokenizer.status().message()).c_str());
    return 1;
  }
  for (const int32_t id : *ids) {
    if (id < 0 || id >= (*tokenizer)->vocab_size()) {
      std::fprintf(stderr, "lmserve detokenize: id %d is outside the vocabulary (size %d)\n", id,
                   (*tokenizer)->vocab_size());
      return 1;
    }
  }
  PrintJson({{"text", (*tokenizer)->Decode(*ids, args.GetFlag("skip-special"))}});
  return 0;
}

}  // namespace lmserve::server
