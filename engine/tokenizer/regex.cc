#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/strings.h"
#include "engine/tokenizer/unicode.h"

namespace lmserve::engine::tokenizer_internal {
namespace {

// Per-thread match state: one ovector pair is all FindAll reads, and a JIT stack large enough for
// look-ahead over long whitespace runs (PCRE2's default is 32 KiB).
class MatchState {
 public:
  MatchState()
      : match_data_(pcre2_match_data_create(1, nullptr)),
        context_(pcre2_match_context_create(nullptr)),
        jit_stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (context_ != nullptr && jit_stack_ != nullptr) {
      pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
    }
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(match_data_);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;

  pcre2_match_data* match_data() const { return match_data_; }
  pcre2_match_context* context() const { return context_; }

 private:
  pcre2_match_data* match_data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* jit_stack_;
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(StrCat("bad regular expression '", pattern, "' at offset ",
                                             error_offset, ": ",
                                             reinterpret_cast<const char*>(message)));
  }
  // JIT compilation failing (an unsupported platform) leaves the interpreter, which is correct.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), code));
}

std::string Regex::Escape(std::string_view literal) {
  // \Q...\E quotes everything but "\E" itself, which is spliced in as an escaped pair.
  std::string out = "\\Q";
  size_t pos = 0;
  while (true) {
    const size_t end = literal.find("\\E", pos);
    if (end == std::string_view::npos) {
      out.append(literal.substr(pos));
      break;
    }
    out.append(literal.substr(pos, end - pos));
    out.append("\\E\\\\E\\Q");
    pos = end + 2;
  }
  out.append("\\E");
  return out;
}

Regex::~Regex() { pcre2_code_free(code_); }

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  MatchState& state = ThreadMatchState();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK,
                         state.match_data(), state.context());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Pathological backtracking: the interpreter keeps its frames on the heap.
      rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       state.match_data(), state.context());
    }
    // No (further) match, or a resource limit: the rest of the text stays unmatched.
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end > start) {
      matches.emplace_back(start, end);
      offset = end;
    } else {
      // An empty match: move on by one character.
      if (start >= text.size()) break;
      offset = start + Utf8SequenceLength(static_cast<uint8_t>(text[start]));
    }
  }
  return matches;
}

}  // namespace lmserve::engine::tokenizer_internal
