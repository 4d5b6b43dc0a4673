// lmserve-structured-bench: the cost of structured output (engine/structured).
//
// mask: host mask time per sequence per token. The vocabulary of --tokenizer (a tokenizer.json or
//   a GGUF; bench/make_bytelevel_vocab.py writes a 128,256-token byte-level one) becomes the token
//   trie; --schema (a JSON Schema file; default: an OpenAI-strict-style record) is compiled; then
//   --sequences walks of --tokens steps each: at every step the sequence's mask is computed
//   (GrammarMatcher::FillMask, the engine's host work per constrained token) and a token drawn
//   from the allowed ones (seeded; EOS taken as soon as it is allowed, so walks restart at the
//   schema's start and cover all of it). Reported: the time per mask (mean, median, p90, p99) in
//   two settings, "shared" (one compiled grammar for all sequences, as the server shares one per
//   schema: its mask cache serves repeated states) and "cold" (a fresh compiled grammar per
//   sequence: every state's first walk of the trie, the worst case), and the trie's size. Times are
//   the thread's CPU time; besides, the wall time of each drawn token's GrammarMatcher::AcceptToken
//   (the engine's host work per constrained token after a step, serial with the GPU), and of the
//   same advance with the state found by hashing it (CompiledGrammar::AdvanceBytes without the
//   matcher's DFA id), each first in turn.
//
// step: engine step time at a batch of --batch sequences, each with the JSON schema, against the
//   same batch unconstrained. Two settings of the schema (--schemas shared|cold|both): "shared",
//   every request brings the schema and it is compiled through one ConstraintCompiler, which
//   caches by content, so all share one compiled grammar (what the server does: its first
//   request compiles it); "cold", a fresh compile per request (distinct schemas, the worst case:
//   no mask is shared). The model (--model, --load-format dummy for random weights of its shape)
//   and its tokenizer (--tokenizer; default: the model's) are served by --backend cpu|cuda; every
//   request has a --prompt-tokens prompt and up to --max-tokens tokens at temperature 1
//   (unconstrained: EOS ignored). One runner and engine serve every setting, --rounds times in
//   turn (unconstrained, shared, cold, unconstrained, ...) after one round of warm-up that is not
//   counted: a runner times its GEMM candidates at start-up, and two runners may choose
//   differently, so ratios are taken within one runner. A constrained round stops earlier (its
//   first constraint end), so its ratio is also given over the same contexts (each round's first
//   n full decode steps of both settings).
//   Reported: the median, p90 and mean wall time of the decode-only steps with the whole batch
//   running, constrained / unconstrained (overall and per round), and the step's parts (median
//   and mean; the means add up to the mean step): the host's work before the launch (EngineStats::
//   total_prepare_seconds), the launch, the host masks (EngineStats::total_mask_seconds: the wall
//   time of a step's masks, which overlap the forward pass), Finish (which waits for the GPU), the
//   host's work after it (total_process_seconds: the tokens appended, grammars advanced); on CUDA
//   the step's time on the GPU (--device-time 1: CUDA events; RunnerStats::
//   total_device_step_seconds), the masks' upload in Finish and how long the draw waited on the
//   device for their release (RunnerStats::total_mask_upload_seconds, total_mask_wait_seconds);
//   and how many of those steps replayed a CUDA graph (RunnerStats::num_graph_replays; masked
//   steps do too). --variants one,per-row,one-pinned: the device draws to compare, each on its own
//   runner: one poller a step (the runner's), every masked row's block polling
//   (RunnerConfig::device_mask_poll_per_row, the former design), one poller with the kernel
//   reading the masks from pinned memory (device_mask_read_pinned). --timeline FILE (CUDA builds):
//   one more round (unconstrained, shared) whose full decode steps 20, 40 and 60 record their
//   kernels (CUPTI), printed by share and written to FILE as JSON. --device-mask 1 samples the constrained rows on the device
//   (RunnerConfig::device_token_bitmask: the engine's host masks uploaded and applied by
//   kernels/cuda/token_bitmask.h before the device sampler); 0 (the default) brings their logits
//   to the host, where the engine masks and samples them. --overlap 0 computes the masks before
//   the step's launch (EngineConfig::overlap_structured_masks), --mask-threads N on N threads
//   (EngineConfig::structured_mask_threads; 0: the engine's default). The issue's target is at most
//   1.05x on an H100 at batch 64.
//
// Usage: lmserve-structured-bench mask --tokenizer PATH [--schema FILE] [--sequences 64]
//          [--tokens 128] [--seed 1]
//        lmserve-structured-bench step --model PATH [--tokenizer PATH] [--backend cpu|cuda]
//          [--load-format dummy] [--batch 64] [--prompt-tokens 32] [--max-tokens 128]
//          [--schema FILE] [--threads 0] [--kv-cache-mib 2048] [--device-mask 0|1]
//          [--schemas shared|cold|both] [--overlap 0|1] [--mask-threads 0] [--rounds 2]
//          [--device-time 0|1] [--variants one,per-row,one-pinned] [--timeline FILE]

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/strings.h"
#include "engine/core/engine_core.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "engine/structured/constraint.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_trie.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#ifdef LMSERVE_STRUCTURED_BENCH_TIMELINE
#include "bench/cuda/kernel_timeline.h"
#endif

namespace {

using lmserve::StrCat;
namespace engine = lmserve::engine;
namespace structured = lmserve::engine::structured;

constexpr const char* kDefaultSchema = R"({"type": "object", "properties": {
  "title": {"type": "string", "maxLength": 60},
  "year": {"type": ["integer", "null"]},
  "author": {"type": "object", "properties": {
    "name": {"type": "string"}, "born": {"type": "integer", "minimum": 1000, "maximum": 2030}},
    "required": ["name", "born"], "additionalProperties": false},
  "genres": {"type": "array", "items": {"enum": ["fiction", "history", "science", "poetry"]},
             "maxItems": 4},
  "rating": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 5}, {"type": "null"}]},
  "isbn": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{10}$"}},
  "required": ["title", "year", "author", "genres", "rating", "isbn"],
  "additionalProperties": false})";

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "lmserve-structured-bench: %s\n", message.c_str());
  std::exit(2);
}

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double at = p * static_cast<double>(values.size() - 1);
  const auto low = static_cast<size_t>(at);
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (at - static_cast<double>(low));
}

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  double sum = 0.0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

struct Flags {
  std::string command;
  std::string tokenizer, model, schema_file, backend = "cpu", load_format, schemas = "both";
  int64_t sequences = 64, tokens = 128, seed = 1, batch = 64, prompt_tokens = 32,
          max_tokens = 128, threads = 0, kv_cache_mib = 2048, device_mask = 0, overlap = 1,
          mask_threads = 0, rounds = 2, device_time = 1;
  std::string variants = "one", timeline;
};

Flags ParseFlags(int argc, char** argv) {
  if (argc < 2) Fail("usage: lmserve-structured-bench mask|step --flag value ... (see the source)");
  Flags flags;
  flags.command = argv[1];
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Fail(StrCat(flag, " needs a value"));
    const std::string value = argv[i + 1];
    const auto number = [&]() {
      std::optional<int64_t> parsed = lmserve::ParseInt<int64_t>(value);
      if (!parsed.has_value() || *parsed < 0) Fail(StrCat(flag, ": not a number: ", value));
      return *parsed;
    };
    if (flag == "--tokenizer") flags.tokenizer = value;
    else if (flag == "--model") flags.model = value;
    else if (flag == "--schema") flags.schema_file = value;
    else if (flag == "--backend") flags.backend = value;
    else if (flag == "--load-format") flags.load_format = value;
    else if (flag == "--sequences") flags.sequences = number();
    else if (flag == "--tokens") flags.tokens = number();
    else if (flag == "--seed") flags.seed = number();
    else if (flag == "--batch") flags.batch = number();
    else if (flag == "--prompt-tokens") flags.prompt_tokens = number();
    else if (flag == "--max-tokens") flags.max_tokens = number();
    else if (flag == "--threads") flags.threads = number();
    else if (flag == "--kv-cache-mib") flags.kv_cache_mib = number();
    else if (flag == "--device-mask") flags.device_mask = number();
    else if (flag == "--schemas") flags.schemas = value;
    else if (flag == "--overlap") flags.overlap = number();
    else if (flag == "--mask-threads") flags.mask_threads = number();
    else if (flag == "--rounds") flags.rounds = number();
    else if (flag == "--device-time") flags.device_time = number();
    else if (flag == "--variants") flags.variants = value;
    else if (flag == "--timeline") flags.timeline = value;
    else Fail(StrCat("unknown flag ", flag));
  }
  return flags;
}

std::string SchemaText(const Flags& flags) {
  if (flags.schema_file.empty()) return kDefaultSchema;
  std::ifstream in(flags.schema_file);
  if (!in) Fail(StrCat("cannot read ", flags.schema_file));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::unique_ptr<structured::TokenTrie> LoadTrie(const std::string& path, int64_t vocab_size,
                                                std::unique_ptr<engine::Tokenizer>* out) {
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tokenizer = engine::Tokenizer::Load(path);
  if (!tokenizer.ok()) Fail(StrCat(path, ": ", tokenizer.status().ToString()));
  std::vector<int32_t> eos;
  for (auto id : {(*tokenizer)->eos_id(), (*tokenizer)->eot_id()}) {
    if (id.has_value()) eos.push_back(*id);
  }
  if (vocab_size <= 0) vocab_size = (*tokenizer)->vocab_size();
  const double start = WallSeconds();
  absl::StatusOr<std::unique_ptr<structured::TokenTrie>> trie =
      structured::TokenTrie::FromTokenizer(**tokenizer, vocab_size, eos);
  if (!trie.ok()) Fail(trie.status().ToString());
  std::printf("vocabulary %lld tokens (tokenizer %d), trie %zu nodes, built in %.1f ms\n",
              static_cast<long long>(vocab_size), (*tokenizer)->vocab_size(),
              (*trie)->nodes().size(), 1e3 * (WallSeconds() - start));
  *out = *std::move(tokenizer);
  return *std::move(trie);
}

std::shared_ptr<structured::CompiledGrammar> CompileSchema(const std::string& schema,
                                                           const structured::TokenTrie& trie) {
  absl::StatusOr<structured::Grammar> grammar = structured::CompileGrammar(
      {structured::ConstraintKind::kJsonSchema, schema}, structured::GrammarLimits{});
  if (!grammar.ok()) Fail(grammar.status().ToString());
  return std::make_shared<structured::CompiledGrammar>(*std::move(grammar), &trie, "json_schema");
}

int RunMask(const Flags& flags) {
  if (flags.tokenizer.empty()) Fail("mask: --tokenizer is required");
  std::unique_ptr<engine::Tokenizer> tokenizer;
  std::unique_ptr<structured::TokenTrie> trie = LoadTrie(flags.tokenizer, 0, &tokenizer);
  const std::string schema = SchemaText(flags);
  std::vector<uint32_t> mask(static_cast<size_t>(trie->mask_words()));
  for (const bool shared : {true, false}) {
    std::mt19937_64 rng(static_cast<uint64_t>(flags.seed));
    std::shared_ptr<structured::CompiledGrammar> grammar = CompileSchema(schema, *trie);
    std::vector<double> seconds, accept_seconds, hashed_seconds;
    int64_t walks_before = 0, walks = 0;
    for (int64_t s = 0; s < flags.sequences; ++s) {
      if (!shared) {
        walks += grammar->num_mask_walks() - walks_before;
        grammar = CompileSchema(schema, *trie);
        walks_before = 0;
      }
      auto matcher = std::make_unique<structured::GrammarMatcher>(grammar);
      // The matcher's state, advanced apart without its DFA id (the state hashed to find it).
      structured::State shadow = grammar->Initial(), shadow_next;
      for (int64_t t = 0; t < flags.tokens; ++t) {
        const double start = ThreadSeconds();
        matcher->FillMask(mask);
        seconds.push_back(ThreadSeconds() - start);
        std::vector<int32_t> allowed;
        bool eos = false;
        for (int64_t id = 0; id < trie->vocab_size(); ++id) {
          if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(static_cast<int32_t>(id));
        }
        for (int32_t id : trie->eos_token_ids()) {
          eos |= (mask[id >> 5] >> (id & 31)) & 1;
        }
        if (allowed.empty() || eos || matcher->MustEnd()) {
          matcher = std::make_unique<structured::GrammarMatcher>(grammar);  // a new record
          shadow = grammar->Initial();
          continue;
        }
        const int32_t drawn = allowed[rng() % allowed.size()];
        // Wall time (steady_clock: a thread's CPU clock costs more than the call); the two in
        // turn first, the first one meeting the caches as the mask walk left them.
        bool accepted = false, failed = false;
        const auto accept = [&] {
          const double start = WallSeconds();
          accepted = matcher->AcceptToken(drawn);
          accept_seconds.push_back(WallSeconds() - start);
        };
        const auto hashed = [&] {
          const double start = WallSeconds();
          grammar->AdvanceBytes(shadow, trie->TokenBytes(drawn), &shadow_next, &failed);
          hashed_seconds.push_back(WallSeconds() - start);
        };
        if (t % 2 == 0) {
          accept();
          hashed();
        } else {
          hashed();
          accept();
        }
        if (!accepted) Fail("a masked token refused");
        std::swap(shadow, shadow_next);
      }
    }
    walks += grammar->num_mask_walks() - walks_before;
    double sum = 0.0;
    for (double v : seconds) sum += v;
    std::printf(
        "%-6s masks %zu: mean %.3f ms, median %.3f ms, p90 %.3f ms, p99 %.3f ms per sequence per "
        "token; trie walks %lld (%.1f%% of masks; the rest from the cache)\n",
        shared ? "shared" : "cold", seconds.size(), 1e3 * sum / static_cast<double>(seconds.size()),
        1e3 * Percentile(seconds, 0.5), 1e3 * Percentile(seconds, 0.9),
        1e3 * Percentile(seconds, 0.99), static_cast<long long>(walks),
        100.0 * static_cast<double>(walks) / static_cast<double>(seconds.size()));
    std::printf(
        "       tokens accepted (GrammarMatcher::AcceptToken, wall) %zu: mean %.2f us, median "
        "%.2f us, p90 %.2f us, p99 %.2f us\n"
        "       the same advance with the state looked up by hash: mean %.2f us, median %.2f us\n",
        accept_seconds.size(), 1e6 * Mean(accept_seconds), 1e6 * Percentile(accept_seconds, 0.5),
        1e6 * Percentile(accept_seconds, 0.9), 1e6 * Percentile(accept_seconds, 0.99),
        1e6 * Mean(hashed_seconds), 1e6 * Percentile(hashed_seconds, 0.5));
  }
  return 0;
}

// The kernels of one engine step (CUPTI, bench/cuda/kernel_timeline.h; CUDA builds only): started
// before the step, finished after it (Step has waited for the GPU). Finish prints the step's
// kernels by their share of the critical path and the draw's kernels one by one, and returns them.
class TimelineRecorder {
 public:
  TimelineRecorder() {
#ifdef LMSERVE_STRUCTURED_BENCH_TIMELINE
    auto timeline = lmserve::bench::KernelTimeline::Start();
    if (timeline.ok()) {
      timeline_ = *std::move(timeline);
    } else {
      error_ = timeline.status().ToString();
    }
#else
    error_ = "kernel timelines need a CUDA build";
#endif
  }

  nlohmann::json Finish(const std::string& label) {
#ifdef LMSERVE_STRUCTURED_BENCH_TIMELINE
    if (timeline_ != nullptr) {
      const std::vector<lmserve::bench::KernelRecord> records = timeline_->Stop();
      timeline_.reset();
      if (records.empty()) return nlohmann::json::object();
      uint64_t first = records.front().start_ns;
      for (const auto& r : records) first = std::min(first, r.start_ns);
      const double span_us = 1e-3 * static_cast<double>(records.back().end_ns - first);
      std::printf("  timeline, %s: %zu kernels over %.1f us; by share of the critical path:\n",
                  label.c_str(), records.size(), span_us);
      nlohmann::json shares = nlohmann::json::array();
      for (const lmserve::bench::KernelShare& k : lmserve::bench::Summarize(records)) {
        if (k.critical_us >= 0.01 * span_us) {
          std::printf("    %8.1f us %5.1f%%  %4d x %7.2f us busy  %s\n", k.critical_us,
                      100.0 * k.critical_us / span_us, k.count, k.busy_us / k.count,
                      k.name.c_str());
        }
        shares.push_back({{"name", k.name}, {"count", k.count}, {"busy_us", k.busy_us},
                          {"critical_us", k.critical_us}});
      }
      // The step's last kernels (the LM head and the draw), start and end from the first start.
      std::printf("    the last kernels (start, end, busy us):\n");
      const size_t tail = std::min<size_t>(records.size(), 6);
      for (size_t i = records.size() - tail; i < records.size(); ++i) {
        const auto& r = records[i];
        std::printf("      %9.2f %9.2f %7.2f  %s\n", 1e-3 * static_cast<double>(r.start_ns - first),
                    1e-3 * static_cast<double>(r.end_ns - first),
                    1e-3 * static_cast<double>(r.end_ns - r.start_ns), r.name.c_str());
      }
      nlohmann::json kernels = nlohmann::json::array();
      for (const auto& r : records) {
        kernels.push_back({{"name", r.name},
                           {"start_us", 1e-3 * static_cast<double>(r.start_ns - first)},
                           {"end_us", 1e-3 * static_cast<double>(r.end_ns - first)}});
      }
      return {{"step", label}, {"span_us", span_us}, {"shares", shares}, {"kernels", kernels}};
    }
#endif
    std::printf("  timeline, %s: %s\n", label.c_str(), error_.c_str());
    return nlohmann::json::object();
  }

 private:
#ifdef LMSERVE_STRUCTURED_BENCH_TIMELINE
  std::unique_ptr<lmserve::bench::KernelTimeline> timeline_;
#endif
  std::string error_;
};

// One setting's full decode steps (all rounds), each step's parts.
struct StepSamples {
  std::vector<double> step, prepare, launch, masks, finish, process, device, upload, wait;
  int64_t graph_replays = 0, tokens = 0;
  std::map<std::string, int> reasons;
  std::string first_error;
};

int RunStep(const Flags& flags) {
  if (flags.model.empty()) Fail("step: --model is required");
  if (flags.schemas != "shared" && flags.schemas != "cold" && flags.schemas != "both") {
    Fail(StrCat("--schemas: shared, cold or both, not ", flags.schemas));
  }
  // The device draw's designs to compare, each on its own runner: one poller a step (the
  // runner's), every masked row's block polling, one poller with the masks read from pinned memory.
  struct Variant {
    std::string name;
    bool per_row = false, pinned = false;
  };
  std::vector<Variant> variants;
  for (const std::string& name : std::vector<std::string>(absl::StrSplit(flags.variants, ','))) {
    if (name == "one") {
      variants.push_back({"one poller", false, false});
    } else if (name == "per-row") {
      variants.push_back({"poll per row", true, false});
    } else if (name == "one-pinned") {
      variants.push_back({"one poller, pinned masks", false, true});
    } else {
      Fail(StrCat("--variants: one, per-row or one-pinned, not ", name));
    }
  }
  if (flags.rounds < 1) Fail("--rounds: at least 1");
  absl::StatusOr<std::unique_ptr<engine::Checkpoint>> checkpoint =
      flags.load_format == "dummy" ? engine::OpenConfigOnlyCheckpoint(flags.model)
                                   : engine::OpenCheckpoint(flags.model);
  if (!checkpoint.ok()) Fail(checkpoint.status().ToString());
  const engine::ModelConfig model = (*checkpoint)->config();
  std::unique_ptr<engine::Tokenizer> tokenizer;
  std::unique_ptr<structured::TokenTrie> trie =
      LoadTrie(flags.tokenizer.empty() ? flags.model : flags.tokenizer, model.vocab_size,
               &tokenizer);
  const structured::TokenTrie* trie_ptr = trie.get();
  const std::string schema = SchemaText(flags);
  enum class Setting { kUnconstrained, kShared, kCold };
  std::vector<Setting> settings = {Setting::kUnconstrained};
  if (flags.schemas != "cold") settings.push_back(Setting::kShared);
  if (flags.schemas != "shared") settings.push_back(Setting::kCold);
  const auto setting_name = [](Setting setting) {
    return setting == Setting::kUnconstrained ? "unconstrained"
           : setting == Setting::kShared      ? "schema-shared"
                                              : "schema-cold";
  };
  // The server's compiler: one per tokenizer, caching compiled constraints by content.
  structured::ConstraintCompiler compiler(std::move(trie), structured::GrammarLimits{});
  std::vector<nlohmann::json> timelines;
  for (const Variant& variant : variants) {
    const bool per_row = variant.per_row;
    // One runner and engine for every setting and round: a runner's GEMM plans are chosen by
    // timing at its start, and two runners may choose differently (tens of us a step), so each
    // ratio compares steps of the same plans.
    engine::RunnerConfig runner_config;
    runner_config.backend =
        flags.backend == "cuda" ? engine::Backend::kCuda : engine::Backend::kCpu;
    runner_config.load_format =
        flags.load_format == "dummy" ? engine::LoadFormat::kDummy : engine::LoadFormat::kCheckpoint;
    runner_config.kv_cache_bytes = flags.kv_cache_mib << 20;
    runner_config.num_threads = static_cast<int32_t>(flags.threads);
    runner_config.max_num_seqs = static_cast<int32_t>(std::max<int64_t>(flags.batch, 1));
    runner_config.device_token_bitmask = flags.device_mask != 0;
    runner_config.device_mask_poll_per_row = per_row;
    runner_config.device_mask_read_pinned = variant.pinned;
    runner_config.time_device_steps = flags.device_time != 0;
    absl::StatusOr<std::unique_ptr<engine::ModelRunner>> runner =
        engine::ModelRunner::Create(**checkpoint, runner_config);
    if (!runner.ok()) Fail(runner.status().ToString());
    engine::EngineConfig config;
    config.max_num_seqs = static_cast<int32_t>(flags.batch);
    config.enable_prefix_caching = false;
    config.overlap_structured_masks = flags.overlap != 0;
    config.structured_mask_threads = static_cast<int32_t>(flags.mask_threads);
    absl::StatusOr<std::unique_ptr<engine::EngineCore>> core =
        engine::EngineCore::Create(*std::move(runner), config, nullptr);
    if (!core.ok()) Fail(core.status().ToString());
    const std::string poll_name = flags.backend != "cuda" || flags.device_mask == 0
                                      ? std::string()
                                      : StrCat(" [", variant.name, "]");
    const char* poll = poll_name.c_str();
    std::map<Setting, StepSamples> samples;
    std::map<Setting, std::vector<double>> round_medians;
    // Each round's step times in order: step i of every setting has the same context length.
    std::map<Setting, std::vector<std::vector<double>>> round_steps_by_setting;
    engine::RequestId next_id = 1;
    // Round 0 warms up (the shared grammar's tables and masks, the runner); not counted. The
    // last round, with --timeline, records kernel timelines of a few steps instead.
    const bool timeline_round = !flags.timeline.empty() && flags.backend == "cuda";
    for (int64_t round = 0; round <= flags.rounds + (timeline_round ? 1 : 0); ++round) {
      const bool warmup = round == 0;
      const bool recording = timeline_round && round == flags.rounds + 1;
      for (const Setting setting : settings) {
        if (recording && setting == Setting::kCold) continue;
        const bool constrained = setting != Setting::kUnconstrained;
        std::mt19937 rng(static_cast<uint32_t>(flags.seed));
        std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(model.vocab_size) - 1);
        std::vector<std::shared_ptr<engine::OutputStream>> streams;
        for (int64_t i = 0; i < flags.batch; ++i) {
          engine::Request request;
          request.prompt_token_ids.resize(static_cast<size_t>(flags.prompt_tokens));
          for (int32_t& id : request.prompt_token_ids) id = token(rng);
          request.sampling.temperature = 1.0;
          request.sampling.seed = static_cast<uint64_t>(i);
          request.sampling.max_tokens = static_cast<int32_t>(flags.max_tokens);
          if (setting == Setting::kShared) {
            // Every request brings the schema; the compiler's cache gives all the same grammar.
            absl::StatusOr<std::shared_ptr<structured::CompiledGrammar>> compiled =
                compiler.Compile({structured::ConstraintKind::kJsonSchema, schema});
            if (!compiled.ok()) Fail(compiled.status().ToString());
            request.sampling.constraint = *std::move(compiled);
          } else if (setting == Setting::kCold) {
            // Each request its own compiled schema: no mask is shared between sequences.
            request.sampling.constraint = CompileSchema(schema, *trie_ptr);
          }
          request.sampling.ignore_eos = !constrained;
          const engine::RequestId id = next_id++;
          streams.push_back(std::make_shared<engine::OutputStream>(id, 1));
          (*core)->AddRequest(id, std::move(request), 0.0, streams.back());
        }
        StepSamples discarded;
        StepSamples& out = warmup || recording ? discarded : samples[setting];
        std::vector<double> round_steps;
        int64_t full_steps = 0;
        while ((*core)->HasWork()) {
          const engine::RunnerStats runner_before = (*core)->runner().stats();
          const engine::EngineStats before = (*core)->Stats();
          // Recording: the kernels of a few full decode steps, the same ones in every setting.
          const bool record = recording && (full_steps == 20 || full_steps == 40 ||
                                            full_steps == 60);
          std::unique_ptr<TimelineRecorder> recorder;
          if (record) recorder = std::make_unique<TimelineRecorder>();
          const double start = WallSeconds();
          (*core)->Step();
          const double seconds = WallSeconds() - start;
          if (recorder != nullptr) {
            timelines.push_back(recorder->Finish(StrCat(variant.name, " / ", setting_name(setting),
                                                        " / full decode step ", full_steps)));
          }
          const auto& scheduled = (*core)->last_scheduled();
          const bool full_decode =
              static_cast<int64_t>(scheduled.size()) == flags.batch &&
              std::all_of(scheduled.begin(), scheduled.end(),
                          [](const engine::EngineCore::StepEntry& e) {
                            return e.num_new_tokens == 1;
                          });
          if (!full_decode) continue;
          ++full_steps;
          const engine::EngineStats after = (*core)->Stats();
          const engine::RunnerStats runner_after = (*core)->runner().stats();
          round_steps.push_back(seconds);
          out.step.push_back(seconds);
          out.prepare.push_back(after.total_prepare_seconds - before.total_prepare_seconds);
          out.launch.push_back(after.total_launch_seconds - before.total_launch_seconds);
          out.masks.push_back(after.total_mask_seconds - before.total_mask_seconds);
          out.finish.push_back(after.total_finish_seconds - before.total_finish_seconds);
          out.process.push_back(after.total_process_seconds - before.total_process_seconds);
          out.device.push_back(runner_after.total_device_step_seconds -
                               runner_before.total_device_step_seconds);
          out.upload.push_back(runner_after.total_mask_upload_seconds -
                               runner_before.total_mask_upload_seconds);
          out.wait.push_back(runner_after.total_mask_wait_seconds -
                             runner_before.total_mask_wait_seconds);
          out.graph_replays += runner_after.num_graph_replays - runner_before.num_graph_replays;
        }
        if (warmup || recording) {
          // The requests' outputs are dropped with their streams.
          continue;
        }
        round_medians[setting].push_back(Percentile(round_steps, 0.5));
        round_steps_by_setting[setting].push_back(round_steps);
        // How the requests ended (a constrained one by its constraint or EOS; an error is a bug).
        for (const auto& stream : streams) {
          engine::RequestOutput output;
          while (stream->Next(&output, absl::ZeroDuration()) ==
                 engine::OutputStream::NextResult::kOutput) {
            out.tokens += static_cast<int64_t>(output.token_ids.size());
            if (!output.finished) continue;
            ++out.reasons[std::string(engine::FinishReasonName(output.finish_reason))];
            if (!output.error.empty() && out.first_error.empty()) out.first_error = output.error;
          }
        }
        std::printf("%s round %lld %-13s: %zu full decode steps, median %.3f ms\n", poll,
                    static_cast<long long>(round), setting_name(setting), round_steps.size(),
                    1e3 * round_medians[setting].back());
      }
    }
    const double unconstrained_median =
        Percentile(samples[Setting::kUnconstrained].step, 0.5);
    for (const Setting setting : settings) {
      const StepSamples& out = samples[setting];
      const double median = Percentile(out.step, 0.5);
      std::string rounds;
      if (setting != Setting::kUnconstrained) {
        // Matched: each round's first n steps of both (n the fewer), so that the two medians
        // cover the same context lengths (an unconstrained round runs longer, to longer contexts).
        std::vector<double> matched_u, matched_c;
        for (size_t r = 0; r < round_medians[setting].size(); ++r) {
          const std::vector<double>& u = round_steps_by_setting[Setting::kUnconstrained][r];
          const std::vector<double>& c = round_steps_by_setting[setting][r];
          const size_t n = std::min(u.size(), c.size());
          const std::vector<double> u_n(u.begin(), u.begin() + static_cast<ptrdiff_t>(n));
          const std::vector<double> c_n(c.begin(), c.begin() + static_cast<ptrdiff_t>(n));
          matched_u.insert(matched_u.end(), u_n.begin(), u_n.end());
          matched_c.insert(matched_c.end(), c_n.begin(), c_n.end());
          rounds += StrCat(r == 0 ? "" : ", ", Percentile(c_n, 0.5) / Percentile(u_n, 0.5));
        }
        rounds = StrCat(" (", median / unconstrained_median,
                        "x unconstrained; over the same contexts: ",
                        Percentile(matched_c, 0.5) / Percentile(matched_u, 0.5), "x, by round: ",
                        rounds, ")");
      }
      std::printf(
          "%-13s%s batch %lld: %zu full decode steps (%lld replayed CUDA graphs), median %.3f ms, "
          "p90 %.3f ms, mean %.3f ms%s\n",
          setting_name(setting), poll, static_cast<long long>(flags.batch), out.step.size(),
          static_cast<long long>(out.graph_replays), 1e3 * median, 1e3 * Percentile(out.step, 0.9),
          1e3 * Mean(out.step), rounds.c_str());
      // The parts of a step, in order; their means add up to the mean step (medians do not).
      std::printf(
          "              per step, median / mean ms: prepare %.3f / %.3f; launch %.3f / %.3f; "
          "host masks %.3f / %.3f; finish (waits for the GPU) %.3f / %.3f; process %.3f / %.3f\n",
          1e3 * Percentile(out.prepare, 0.5), 1e3 * Mean(out.prepare),
          1e3 * Percentile(out.launch, 0.5), 1e3 * Mean(out.launch),
          1e3 * Percentile(out.masks, 0.5), 1e3 * Mean(out.masks),
          1e3 * Percentile(out.finish, 0.5), 1e3 * Mean(out.finish),
          1e3 * Percentile(out.process, 0.5), 1e3 * Mean(out.process));
      if (flags.backend == "cuda") {
        // Polling per row, the wait is not measured (only the one poller writes it).
        std::printf(
            "              device, median / mean ms: step on the GPU %.3f / %.3f%s; in finish, "
            "masks' upload %.3f / %.3f; the draw's wait for the release %s\n",
            1e3 * Percentile(out.device, 0.5), 1e3 * Mean(out.device),
            flags.device_time != 0 ? "" : " (--device-time 0: not timed)",
            1e3 * Percentile(out.upload, 0.5), 1e3 * Mean(out.upload),
            per_row ? "not measured"
                    : StrCat(Percentile(out.wait, 0.5) * 1e3, " / ", Mean(out.wait) * 1e3).c_str());
      }
      std::string summary;
      for (const auto& [reason, count] : out.reasons) summary += StrCat(" ", reason, " ", count);
      if (!out.first_error.empty()) summary += StrCat("; first error: ", out.first_error);
      std::printf("              %lld tokens; finished:%s\n", static_cast<long long>(out.tokens),
                  summary.c_str());
    }
  }
  if (!flags.timeline.empty()) {
    std::ofstream(flags.timeline) << nlohmann::json(timelines).dump(1) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  if (flags.command == "mask") return RunMask(flags);
  if (flags.command == "step") return RunStep(flags);
  Fail(StrCat("unknown command ", flags.command, " (mask or step)"));
}
