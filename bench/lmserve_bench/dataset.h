// The benchmark's prompts: read from a JSONL file or made up with given length distributions.
//
// JSONL: one JSON object per line, blank lines skipped:
//   {"prompt": "text", "output_len": 128}        a text prompt (needs a server-side tokenizer)
//   {"prompt_token_ids": [1, 2, 3], "output_len": 8}   a token-id prompt
// "output_len" (also accepted: "max_tokens", "output_tokens") is optional; without it the default
// output length applies. "input_len" may give the prompt's token count for text prompts (else the
// server's usage, where it reports one, counts).
//
// Synthetic prompts are token ids drawn uniformly from [first_id, vocab_size), lengths uniform in
// [len * (1 - range_ratio), len * (1 + range_ratio)] (vLLM's "random" dataset), from a seeded
// generator: the same seed gives the same prompts.

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_DATASET_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::bench {

struct Prompt {
  std::string text;                // when non-empty, the prompt is text
  std::vector<int32_t> token_ids;  // otherwise the prompt is these ids
  int32_t input_tokens = 0;        // known prompt length in tokens; 0: unknown (text)
  int32_t output_tokens = 0;       // max_tokens to ask for (with ignore_eos)
};

// Parses JSONL text. `default_output_tokens` applies to lines without an output length.
// Errors name the line.
absl::StatusOr<std::vector<Prompt>> ParseJsonlDataset(const std::string& contents,
                                                      int32_t default_output_tokens);
absl::StatusOr<std::vector<Prompt>> ReadJsonlDataset(const std::string& path,
                                                     int32_t default_output_tokens);

struct SyntheticSpec {
  int32_t num_prompts = 0;
  int32_t input_len = 128;
  int32_t output_len = 128;
  double range_ratio = 0;  // in [0, 1)
  int32_t vocab_size = 0;  // > first_id
  int32_t first_id = 0;    // ids below it (often special tokens) are not drawn
  uint64_t seed = 0;
};

absl::StatusOr<std::vector<Prompt>> MakeSyntheticDataset(const SyntheticSpec& spec);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_DATASET_H_
