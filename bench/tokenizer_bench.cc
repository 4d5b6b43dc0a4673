// Tokenizer throughput.
//
// What it measures: Tokenizer::Encode(text, add_special=false) on 1 MiB of varied UTF-8 text (about
// half English prose, then code, numbers, CJK, Cyrillic/Greek/accented text and emoji, generated
// deterministically), single-threaded, for each fixture tokenizer and the demo model's GGUF
// tokenizer when present. Reported as MB/s of input text (1 MB = 1e6 bytes), the median of 5 timed
// runs after one warm-up run ("warm": the BPE word cache holds the corpus's frequent words), and
// the first run of a freshly loaded tokenizer ("cold"). Also Decode of the ids (MB/s of output
// text). Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so that other load on a shared
// machine does not count.
//
// The floor it is measured against: the same text split by the GPT-2 regex alone (PCRE2, JIT) — the
// pre-tokenization every byte-level tokenizer does before any BPE work.
//
// Usage: lmserve-tokenizer-bench [FIXTURES_DIR] [GGUF]
//   FIXTURES_DIR defaults to $LMSERVE_FIXTURES_DIR, else tests/fixtures (run from the repository
//   root); GGUF to the demo model.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using lmserve::engine::Tokenizer;

// Thread CPU time: the machines these run on are shared, and CPU time is what the tokenizer costs.
struct Clock {
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<Clock, duration>;
  static time_point now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec));
  }
};

std::string MakeCorpus(size_t target_bytes) {
  std::mt19937 rng(20261122);
  const auto pick = [&](const std::vector<std::string>& items) -> const std::string& {
    return items[rng() % items.size()];
  };
  const std::vector<std::string> words = {"the",
                                          "of",
                                          "and",
                                          "to",
                                          "in",
                                          "a",
                                          "is",
                                          "that",
                                          "for",
                                          "it",
                                          "as",
                                          "was",
                                          "with",
                                          "be",
                                          "by",
                                          "on",
                                          "not",
                                          "he",
                                          "this",
                                          "are",
                                          "or",
                                          "his",
                                          "from",
                                          "at",
                                          "which",
                                          "but",
                                          "have",
                                          "an",
                                          "had",
                                          "they",
                                          "you",
                                          "were",
                                          "their",
                                          "one",
                                          "all",
                                          "we",
                                          "can",
                                          "her",
                                          "has",
                                          "there",
                                          "been",
                                          "if",
                                          "more",
                                          "when",
                                          "will",
                                          "would",
                                          "who",
                                          "so",
                                          "no",
                                          "model",
                                          "server",
                                          "token",
                                          "language",
                                          "inference",
                                          "throughput",
                                          "latency",
                                          "request",
                                          "batch",
                                          "memory",
                                          "kernel",
                                          "attention",
                                          "quickly",
                                          "understanding",
                                          "nevertheless",
                                          "extraordinary",
                                          "I'm",
                                          "don't",
                                          "they'll",
                                          "we've",
                                          "it's"};
  const std::vector<std::string> code = {
      "for (int i = 0; i < n; ++i) {\n    sum += values[i] * weights[i];\n}\n",
      "def forward(self, x):\n    return self.proj(torch.relu(self.fc(x)))\n",
      "if (!status.ok()) return status;\n",
      "    const auto it = map.find(key);\n    if (it == map.end()) return std::nullopt;\n",
      "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id;\n",
      "<div class=\"row\"><span>{{ item.title }}</span></div>\n",
      "\tmov rax, [rbp-8]\n\tadd rax, 1\n",
      "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<i64>()); }\n"};
  const std::vector<std::string> cjk = {
      "今天天气很好，我们去公园散步吧。", "机器学习模型的推理速度非常重要。",
      "日本語のテキストを処理します。",   "東京都は日本の首都です。",
      "한국어 문장도 포함합니다.",        "你好，世界！"};
  const std::vector<std::string> other = {
      "Привет, как дела? ", "Ελληνικά γράμματα ",          "café naïve façade ",
      "Grüße aus München ", "¿Dónde está la biblioteca? ", "שלום עולם ",
      "مرحبا بالعالم "};
  const std::vector<std::string> emoji = {"😀",  "👍🏽",           "🚀", "🤖", "❤️",
                                          "🇫🇷", "👨‍👩‍👧", "✨"};
  std::string text;
  text.reserve(target_bytes + 256);
  while (text.size() < target_bytes) {
    const unsigned kind = rng() % 20;
    if (kind < 10) {  // a sentence of prose
      const int n = 5 + static_cast<int>(rng() % 20);
      for (int i = 0; i < n; ++i) {
        std::string word = pick(words);
        if (i == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
        text += word;
        text += (i + 1 == n) ? ". " : (rng() % 9 == 0 ? ", " : " ");
      }
      if (rng() % 6 == 0) text += "\n\n";
    } else if (kind < 14) {
      text += pick(code);
    } else if (kind < 16) {  // numbers
      text += std::to_string(rng() % 1000000) + " " + std::to_string(rng() % 100) + "." +
              std::to_string(rng() % 100000) + ", 2026-11-" + std::to_string(10 + rng() % 20) + " ";
    } else if (kind < 18) {
      text += pick(cjk);
    } else if (kind < 19) {
      text += pick(other);
    } else {
      text += pick(emoji) + " ";
    }
  }
  // Cut at a character boundary.
  size_t end = target_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  return text;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

template <typename Fn>
double MedianSeconds(int runs, Fn fn) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const auto start = Clock::now();
    fn();
    times.push_back(Seconds(Clock::now() - start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void BenchOne(const std::string& name, const std::string& path, const std::string& text) {
  auto fresh = Tokenizer::Load(path);
  if (!fresh.ok()) {
    std::printf("%-22s load failed: %s\n", name.c_str(),
                std::string(fresh.status().message()).c_str());
    return;
  }
  const Tokenizer& tokenizer = **fresh;
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::vector<int32_t> ids;
  const auto cold_start = Clock::now();
  ids = tokenizer.Encode(text, false);
  const double cold = Seconds(Clock::now() - cold_start);
  const double warm = MedianSeconds(5, [&] { ids = tokenizer.Encode(text, false); });
  std::string decoded;
  const double decode = MedianSeconds(5, [&] { decoded = tokenizer.Decode(ids, false); });
  std::printf(
      "%-22s %8zu tokens  %5.2f bytes/token  encode cold %6.1f MB/s  warm %6.1f MB/s  "
      "decode %6.1f MB/s%s\n",
      name.c_str(), ids.size(), static_cast<double>(text.size()) / ids.size(), mb / cold, mb / warm,
      static_cast<double>(decoded.size()) / 1e6 / decode,
      decoded == text ? "" : "  (decode differs from the text)");
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::string fixtures = argc > 1 ? argv[1] : "";
  if (fixtures.empty()) {
    const char* env = std::getenv("LMSERVE_FIXTURES_DIR");
    fixtures = env != nullptr ? env : "tests/fixtures";
  }
  std::string gguf = argc > 2 ? argv[2] : "";
  if (gguf.empty()) {
    const char* home = std::getenv("HOME");
    gguf = std::string(home != nullptr ? home : "") +
           "/.cache/lmserve/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  const std::string text = MakeCorpus(1 << 20);
  std::printf(
      "corpus: %zu bytes of generated text (prose, code, numbers, CJK, other scripts, emoji)\n",
      text.size());

  // The floor: GPT-2 regex split alone.
  auto regex = lmserve::engine::tokenizer_internal::Regex::Compile(
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  if (regex.ok()) {
    size_t pieces = 0;
    const double split = MedianSeconds(5, [&] { pieces = (*regex)->FindAll(text).size(); });
    std::printf("%-22s %8zu pieces                       split        %6.1f MB/s  (the floor)\n",
                "gpt2 regex (PCRE2 JIT)", pieces, static_cast<double>(text.size()) / 1e6 / split);
  }
  for (const char* name :
       {"gpt2-bytelevel", "llama3-regex", "smollm-digits", "sentencepiece-bpe"}) {
    BenchOne(name, fixtures + "/tokenizers/" + name + ".json", text);
  }
  std::error_code ec;
  if (fs::exists(gguf, ec)) BenchOne("SmolLM2 (GGUF)", gguf, text);
  return 0;
}
