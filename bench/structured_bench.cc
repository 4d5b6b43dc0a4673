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
//   the thread's CPU time.
//
// step: engine step time at a batch of --batch sequences, each with the JSON schema, against the
//   same batch unconstrained. Two settings of the schema (--schemas shared|cold|both): "shared",
//   every request brings the schema and it is compiled through one ConstraintCompiler, which
//   caches by content, so all share one compiled grammar (what the server does: its first
//   request compiles it); "cold", a fresh compile per request (distinct schemas, the worst case:
//   no mask is shared). The model (--model, --load-format dummy for random weights of its shape)
//   and its tokenizer (--tokenizer; default: the model's) are served by --backend cpu|cuda; every
//   request has a --prompt-tokens prompt and up to --max-tokens tokens at temperature 1
//   (unconstrained: EOS ignored). Reported: the median and p90 wall time of the decode-only steps
//   with the whole batch running, constrained / unconstrained, and the engine's host mask time
//   per step (EngineStats::mask_seconds: the wall time of a step's masks, which overlap the
//   forward pass), and how many of those steps replayed a CUDA graph (RunnerStats::
//   num_graph_replays; masked steps do too). --device-mask 1 samples the constrained rows on the device
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
//          [--schemas shared|cold|both] [--overlap 0|1] [--mask-threads 0]

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

#include "common/strings.h"
#include "engine/core/engine_core.h"
#include "engine/model/checkpoint.h"
#include "engine/runner/model_runner.h"
#include "engine/structured/constraint.h"
#include "engine/structured/matcher.h"
#include "engine/structured/token_trie.h"
#include "engine/tokenizer/tokenizer.h"

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

struct Flags {
  std::string command;
  std::string tokenizer, model, schema_file, backend = "cpu", load_format, schemas = "both";
  int64_t sequences = 64, tokens = 128, seed = 1, batch = 64, prompt_tokens = 32,
          max_tokens = 128, threads = 0, kv_cache_mib = 2048, device_mask = 0, overlap = 1,
          mask_threads = 0;
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
    std::vector<double> seconds;
    int64_t walks_before = 0, walks = 0;
    for (int64_t s = 0; s < flags.sequences; ++s) {
      if (!shared) {
        walks += grammar->num_mask_walks() - walks_before;
        grammar = CompileSchema(schema, *trie);
        walks_before = 0;
      }
      auto matcher = std::make_unique<structured::GrammarMatcher>(grammar);
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
          continue;
        }
        if (!matcher->AcceptToken(allowed[rng() % allowed.size()])) Fail("a masked token refused");
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
  }
  return 0;
}

int RunStep(const Flags& flags) {
  if (flags.model.empty()) Fail("step: --model is required");
  if (flags.schemas != "shared" && flags.schemas != "cold" && flags.schemas != "both") {
    Fail(StrCat("--schemas: shared, cold or both, not ", flags.schemas));
  }
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
  // The server's compiler: one per tokenizer, caching compiled constraints by content.
  structured::ConstraintCompiler compiler(std::move(trie), structured::GrammarLimits{});
  double unconstrained_median = 0.0;
  for (const Setting setting : settings) {
    const bool constrained = setting != Setting::kUnconstrained;
    engine::RunnerConfig runner_config;
    runner_config.backend = flags.backend == "cuda" ? engine::Backend::kCuda : engine::Backend::kCpu;
    runner_config.load_format =
        flags.load_format == "dummy" ? engine::LoadFormat::kDummy : engine::LoadFormat::kCheckpoint;
    runner_config.kv_cache_bytes = flags.kv_cache_mib << 20;
    runner_config.num_threads = static_cast<int32_t>(flags.threads);
    runner_config.max_num_seqs = static_cast<int32_t>(std::max<int64_t>(flags.batch, 1));
    runner_config.device_token_bitmask = flags.device_mask != 0;
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
      streams.push_back(
          std::make_shared<engine::OutputStream>(static_cast<engine::RequestId>(i + 1), 1));
      (*core)->AddRequest(static_cast<engine::RequestId>(i + 1), std::move(request), 0.0,
                          streams.back());
    }
    std::vector<double> steps, masks, launches, finishes;
    int64_t graph_replays = 0;  // of the full decode steps
    while ((*core)->HasWork()) {
      const int64_t replays_before = (*core)->runner().stats().num_graph_replays;
      const engine::EngineStats before = (*core)->Stats();
      const double start = WallSeconds();
      (*core)->Step();
      const double seconds = WallSeconds() - start;
      const auto& scheduled = (*core)->last_scheduled();
      const bool full_decode =
          static_cast<int64_t>(scheduled.size()) == flags.batch &&
          std::all_of(scheduled.begin(), scheduled.end(),
                      [](const engine::EngineCore::StepEntry& e) { return e.num_new_tokens == 1; });
      if (full_decode) {
        const engine::EngineStats after = (*core)->Stats();
        steps.push_back(seconds);
        masks.push_back(after.total_mask_seconds - before.total_mask_seconds);
        launches.push_back(after.total_launch_seconds - before.total_launch_seconds);
        finishes.push_back(after.total_finish_seconds - before.total_finish_seconds);
        graph_replays += (*core)->runner().stats().num_graph_replays - replays_before;
      }
    }
    const double median = Percentile(steps, 0.5);
    const char* name = setting == Setting::kUnconstrained ? "unconstrained"
                       : setting == Setting::kShared      ? "schema-shared"
                                                          : "schema-cold";
    std::printf(
        "%-13s batch %lld: %zu full decode steps (%lld replayed CUDA graphs), median %.3f ms, "
        "p90 %.3f ms%s\n"
        "              per step (median, p90): launch %.3f, %.3f ms; host masks %.3f, %.3f ms; "
        "finish (waits for the GPU) %.3f, %.3f ms\n",
        name, static_cast<long long>(flags.batch), steps.size(),
        static_cast<long long>(graph_replays), 1e3 * median,
        1e3 * Percentile(steps, 0.9),
        constrained && unconstrained_median > 0.0
            ? StrCat(" (", median / unconstrained_median, "x unconstrained)").c_str()
            : "",
        1e3 * Percentile(launches, 0.5), 1e3 * Percentile(launches, 0.9),
        1e3 * Percentile(masks, 0.5), 1e3 * Percentile(masks, 0.9),
        1e3 * Percentile(finishes, 0.5), 1e3 * Percentile(finishes, 0.9));
    // How the requests ended (a constrained one by its constraint or EOS; an error is a bug).
    std::map<std::string, int> reasons;
    std::string first_error;
    int64_t tokens = 0;
    for (const auto& stream : streams) {
      engine::RequestOutput output;
      while (stream->Next(&output, absl::ZeroDuration()) ==
             engine::OutputStream::NextResult::kOutput) {
        tokens += static_cast<int64_t>(output.token_ids.size());
        if (!output.finished) continue;
        ++reasons[std::string(engine::FinishReasonName(output.finish_reason))];
        if (!output.error.empty() && first_error.empty()) first_error = output.error;
      }
    }
    std::string summary;
    for (const auto& [reason, count] : reasons) summary += StrCat(" ", reason, " ", count);
    if (!first_error.empty()) summary += StrCat("; first error: ", first_error);
    std::printf("              %lld tokens; finished:%s\n", static_cast<long long>(tokens),
                summary.c_str());
    if (!constrained) unconstrained_median = median;
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
