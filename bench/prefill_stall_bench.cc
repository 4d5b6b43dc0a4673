// lmserve-prefill-stall-bench: how much one long prompt's prefill delays the tokens of a short
// request that is already streaming (issue 27: on the CPU, an 800-token prompt took a 4-token
// request from 0.25 s to 10.3 s), under each --max-step-slowdown setting.
//
// What it measures, through the public Engine API over the CPU runner, as the server drives it:
//   idle    a short greedy request (--short-prompt tokens, EOS ignored) alone: the median and the
//           largest gap between its consecutive tokens (inter-token latency, ITL), over its tokens
//           after the first.
//   loaded  the same request; once its first token is out, a --long-prompt-token prompt (one
//           output token) is submitted; the short request's ITLs from that moment until the long
//           prompt's first token (its whole prefill): median, largest, and their ratios to the idle
//           median. Also the long prompt's time to first token, the price of its chunks.
//   same-ctx the short request alone once more, as many tokens as it reached in the loaded run:
//           the median of its gaps at the same tokens as the loaded ones, and the loaded median and
//           largest gap over it. With small chunks the prefill takes seconds, the short request
//           generates hundreds of tokens meanwhile, and its own attention over that context grows:
//           these ratios charge the prefill only with what it adds.
// Prompts are random token ids (prefix caching off). Each setting runs --repeats times after one
// warm-up; the table shows the median over runs of each figure. The floor: the idle ITL itself
// (one decode step: every fp32 weight read once); a ratio of 1 would mean the prefill costs the
// stream nothing. The machine's other load shows up as noise: run it a few times.
//
// Usage: lmserve-prefill-stall-bench --model PATH [--short-prompt 4] [--long-prompt 800]
//          [--slowdowns off,2] [--repeats 3] [--threads 0] [--max-batched-tokens 2048]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "engine/core/engine.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"

namespace {

using lmserve::StrCat;
namespace engine = lmserve::engine;

struct Options {
  std::string model;
  int32_t short_prompt = 4;
  int32_t long_prompt = 800;
  std::vector<double> slowdowns = {0.0, 2.0};  // 0: off
  int32_t repeats = 3;
  int32_t threads = 0;
  int32_t max_batched_tokens = 2048;
};

[[noreturn]] void Usage(const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "lmserve-prefill-stall-bench: %s\n", error.c_str());
  std::fprintf(stderr,
               "usage: lmserve-prefill-stall-bench --model PATH [--short-prompt N] "
               "[--long-prompt N]\n"
               "         [--slowdowns off,2] [--repeats N] [--threads N] "
               "[--max-batched-tokens N]\n");
  std::exit(2);
}

int64_t ParseNumber(const std::string& flag, std::string_view text) {
  const std::optional<int64_t> value = lmserve::ParseInt<int64_t>(text);
  if (!value.has_value() || *value < 0) {
    Usage(StrCat("--", flag, ": want a non-negative integer, got '", text, "'"));
  }
  return *value;
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage("");
    if (flag.rfind("--", 0) != 0 || i + 1 >= argc) Usage(StrCat("unexpected argument ", flag));
    flag = flag.substr(2);
    const std::string value = argv[++i];
    if (flag == "model") {
      options.model = value;
    } else if (flag == "short-prompt") {
      options.short_prompt = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "long-prompt") {
      options.long_prompt = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "slowdowns") {
      options.slowdowns.clear();
      for (std::string_view part : lmserve::StrSplit(value, ',')) {
        if (part == "off") {
          options.slowdowns.push_back(0.0);
        } else {
          const double factor = std::atof(std::string(part).c_str());
          if (factor < 1.0) Usage(StrCat("--slowdowns: '", part, "' is not off or a factor >= 1"));
          options.slowdowns.push_back(factor);
        }
      }
    } else if (flag == "repeats") {
      options.repeats = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "threads") {
      options.threads = static_cast<int32_t>(ParseNumber(flag, value));
    } else if (flag == "max-batched-tokens") {
      options.max_batched_tokens = static_cast<int32_t>(ParseNumber(flag, value));
    } else {
      Usage(StrCat("unknown option --", flag));
    }
  }
  if (options.model.empty()) Usage("--model is required");
  if (options.short_prompt < 1 || options.long_prompt < 2 || options.repeats < 1 ||
      options.slowdowns.empty()) {
    Usage("--short-prompt, --repeats must be >= 1, --long-prompt >= 2, --slowdowns not empty");
  }
  return options;
}

double Now() { return engine::SystemClock::Get()->NowSeconds(); }

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double Max(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
}

engine::Request RandomRequest(int32_t prompt_tokens, int32_t max_tokens, int64_t vocab,
                              std::mt19937* rng) {
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab) - 1);
  engine::Request request;
  request.prompt_token_ids.resize(static_cast<size_t>(prompt_tokens));
  for (int32_t& id : request.prompt_token_ids) id = token(*rng);
  request.sampling.temperature = 0.0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

struct Figures {
  double idle_median_itl = 0, idle_max_itl = 0;
  double loaded_median_itl = 0, loaded_max_itl = 0;
  double long_ttft = 0;
  int32_t loaded_tokens = 0;  // the short request's tokens during the prefill
  // Which of the short request's gaps those were: gap i ends at its token i + 1.
  size_t first_gap = 0, end_gap = 0;
};

// The short request alone, `max_tokens` tokens: its ITLs after the first token.
absl::StatusOr<std::vector<double>> IdleItls(engine::Engine& eng, const Options& options,
                                             int32_t max_tokens, std::mt19937* rng) {
  absl::StatusOr<engine::RequestHandle> handle =
      eng.Submit(RandomRequest(options.short_prompt, max_tokens, eng.limits().vocab_size, rng));
  if (!handle.ok()) return handle.status();
  std::vector<double> times;
  engine::RequestOutput output;
  while (handle->stream->Next(&output) == engine::OutputStream::NextResult::kOutput) {
    if (output.finished && output.finish_reason == engine::FinishReason::kError) {
      return absl::InternalError(output.error);
    }
    times.insert(times.end(), output.token_times_seconds.begin(), output.token_times_seconds.end());
  }
  std::vector<double> itls;
  for (size_t i = 1; i < times.size(); ++i) itls.push_back(times[i] - times[i - 1]);
  return itls;
}

// The short request, then the long prompt once the short one streams: the short request's ITLs
// while the long prompt prefills, and the long prompt's time to first token.
absl::StatusOr<Figures> LoadedRun(engine::Engine& eng, const Options& options, std::mt19937* rng) {
  const int64_t vocab = eng.limits().vocab_size;
  const int32_t short_max_tokens = static_cast<int32_t>(
      std::min<int64_t>(eng.limits().max_context_tokens - options.short_prompt, 100000));
  const double short_arrival = Now();
  absl::StatusOr<engine::RequestHandle> short_handle =
      eng.Submit(RandomRequest(options.short_prompt, short_max_tokens, vocab, rng));
  if (!short_handle.ok()) return short_handle.status();
  std::vector<double> times;  // the short request's token times, on the engine's clock
  engine::RequestOutput output;
  auto read_short = [&]() -> bool {
    if (short_handle->stream->Next(&output) != engine::OutputStream::NextResult::kOutput) {
      return false;
    }
    for (double t : output.token_times_seconds) times.push_back(short_arrival + t);
    return !output.finished;
  };
  while (times.empty() && read_short()) {
  }
  if (times.empty()) return absl::InternalError("the short request produced no token");

  const double long_arrival = Now();
  absl::StatusOr<engine::RequestHandle> long_handle =
      eng.Submit(RandomRequest(options.long_prompt, 1, vocab, rng));
  if (!long_handle.ok()) return long_handle.status();
  std::atomic<double> long_first_token{0.0};
  std::thread long_reader([&] {
    engine::RequestOutput long_output;
    while (long_handle->stream->Next(&long_output) == engine::OutputStream::NextResult::kOutput) {
      if (!long_output.token_times_seconds.empty() && long_first_token.load() == 0.0) {
        long_first_token.store(long_arrival + long_output.token_times_seconds.front());
      }
    }
  });
  // Read the short request until it has a token after the long prompt's first one.
  while (read_short()) {
    const double done = long_first_token.load();
    if (done > 0.0 && times.back() > done) break;
  }
  eng.Abort(short_handle->id);
  while (read_short()) {
  }
  long_reader.join();
  const double done = long_first_token.load();
  if (done == 0.0) return absl::InternalError("the long prompt produced no token");

  Figures figures;
  std::vector<double> itls;
  for (size_t i = 1; i < times.size(); ++i) {
    // Gaps that end after the long prompt arrived and start before its first token.
    if (times[i] > long_arrival && times[i - 1] < done) {
      if (itls.empty()) figures.first_gap = i - 1;
      figures.end_gap = i;
      itls.push_back(times[i] - times[i - 1]);
    }
  }
  figures.loaded_median_itl = Median(itls);
  figures.loaded_max_itl = Max(itls);
  figures.loaded_tokens = static_cast<int32_t>(itls.size());
  figures.long_ttft = done - long_arrival;
  return figures;
}

int Main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  auto checkpoint = engine::OpenCheckpoint(options.model);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "lmserve-prefill-stall-bench: %s\n",
                 checkpoint.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "model %s, short prompt %d tokens, long prompt %d tokens, threads %d, "
      "max batched tokens %d, %d runs each (median shown)\n",
      options.model.c_str(), options.short_prompt, options.long_prompt, options.threads,
      options.max_batched_tokens, options.repeats);
  std::printf("%-10s %12s %12s %14s %14s %8s %8s %10s %8s %14s %8s %8s\n", "slowdown",
              "idle ITL p50", "idle ITL max", "loaded ITL p50", "loaded ITL max", "p50 x", "max x",
              "long TTFT", "tokens", "same-ctx p50", "p50 x", "max x");
  for (double slowdown : options.slowdowns) {
    engine::RunnerConfig runner_config;
    runner_config.backend = engine::Backend::kCpu;
    runner_config.kv_cache_bytes = int64_t{512} << 20;
    runner_config.num_threads = options.threads;
    runner_config.max_num_batched_tokens = options.max_batched_tokens;
    auto runner = engine::ModelRunner::Create(**checkpoint, runner_config);
    if (!runner.ok()) {
      std::fprintf(stderr, "lmserve-prefill-stall-bench: %s\n", runner.status().ToString().c_str());
      return 1;
    }
    engine::EngineConfig config;
    config.max_num_batched_tokens = options.max_batched_tokens;
    config.enable_prefix_caching = false;
    config.max_step_slowdown = slowdown;
    auto eng = engine::Engine::Create(*std::move(runner), config);
    if (!eng.ok()) {
      std::fprintf(stderr, "lmserve-prefill-stall-bench: %s\n", eng.status().ToString().c_str());
      return 1;
    }
    std::mt19937 rng(1234);
    std::vector<double> idle_p50, idle_max, same_p50, loaded_p50, loaded_max, long_ttft, tokens;
    for (int32_t run = 0; run <= options.repeats; ++run) {  // run 0 warms up
      absl::StatusOr<std::vector<double>> idle = IdleItls(**eng, options, 32, &rng);
      absl::StatusOr<Figures> loaded =
          idle.ok() ? LoadedRun(**eng, options, &rng) : absl::StatusOr<Figures>(idle.status());
      // The short request alone again, as far as the loaded run went: its gaps at the same
      // tokens (the same contexts) as the loaded ones.
      absl::StatusOr<std::vector<double>> alone =
          loaded.ok() ? IdleItls(**eng, options, static_cast<int32_t>(loaded->end_gap + 1), &rng)
                      : absl::StatusOr<std::vector<double>>(loaded.status());
      if (!alone.ok()) {
        std::fprintf(stderr, "lmserve-prefill-stall-bench: %s\n",
                     alone.status().ToString().c_str());
        return 1;
      }
      if (run == 0) continue;
      idle_p50.push_back(Median(*idle));
      idle_max.push_back(Max(*idle));
      same_p50.push_back(Median(std::vector<double>(
          alone->begin() + static_cast<std::ptrdiff_t>(std::min(loaded->first_gap, alone->size())),
          alone->begin() + static_cast<std::ptrdiff_t>(std::min(loaded->end_gap, alone->size())))));
      loaded_p50.push_back(loaded->loaded_median_itl);
      loaded_max.push_back(loaded->loaded_max_itl);
      long_ttft.push_back(loaded->long_ttft);
      tokens.push_back(loaded->loaded_tokens);
    }
    const double idle = Median(idle_p50), same = Median(same_p50);
    std::printf(
        "%-10s %10.1f ms %10.1f ms %12.1f ms %12.1f ms %8.2f %8.2f %8.2f s %8.0f %11.1f ms %8.2f "
        "%8.2f\n",
        slowdown == 0.0 ? "off" : StrCat(slowdown).c_str(), 1e3 * idle, 1e3 * Median(idle_max),
        1e3 * Median(loaded_p50), 1e3 * Median(loaded_max), Median(loaded_p50) / idle,
        Median(loaded_max) / idle, Median(long_ttft), Median(tokens), 1e3 * same,
        Median(loaded_p50) / same, Median(loaded_max) / same);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
