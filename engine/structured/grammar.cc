#include "engine/structured/grammar.h"

#include <algorithm>

#include "common/strings.h"

namespace lmserve::engine::structured {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;

std::string ByteSetKey(const ByteSet& set) {
  return std::string(reinterpret_cast<const char*>(set.bits.data()), sizeof(set.bits));
}

uint32_t MaxOfLength(int length) {
  switch (length) {
    case 1:
      return 0x7F;
    case 2:
      return 0x7FF;
    case 3:
      return 0xFFFF;
    default:
      return kMaxCodepoint;
  }
}

int Utf8Length(uint32_t codepoint) {
  return codepoint <= 0x7F ? 1 : codepoint <= 0x7FF ? 2 : codepoint <= 0xFFFF ? 3 : 4;
}

void SplitUtf8(uint32_t lo, uint32_t hi,
               std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  // Surrogates are not characters.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) SplitUtf8(lo, 0xD7FF, out);
    if (hi > 0xDFFF) SplitUtf8(0xE000, hi, out);
    return;
  }
  // One encoded length at a time.
  for (int length = 1; length < 4; ++length) {
    const uint32_t max = MaxOfLength(length);
    if (lo <= max && hi > max) {
      SplitUtf8(lo, max, out);
      SplitUtf8(max + 1, hi, out);
      return;
    }
  }
  const int length = Utf8Length(lo);
  if (length == 1) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  // Split until every continuation byte position spans its whole range or one value, so that the
  // encodings of [lo, hi] are exactly the product of per-position byte ranges.
  for (int i = 1; i < length; ++i) {
    const uint32_t mask = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        SplitUtf8(lo, lo | mask, out);
        SplitUtf8((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        SplitUtf8(lo, (hi & ~mask) - 1, out);
        SplitUtf8(hi & ~mask, hi, out);
        return;
      }
    }
  }
  std::string lo_bytes;
  std::string hi_bytes;
  AppendUtf8(lo, &lo_bytes);
  AppendUtf8(hi, &hi_bytes);
  std::vector<std::pair<uint8_t, uint8_t>> sequence;
  for (size_t k = 0; k < lo_bytes.size(); ++k) {
    sequence.emplace_back(static_cast<uint8_t>(lo_bytes[k]), static_cast<uint8_t>(hi_bytes[k]));
  }
  out->push_back(std::move(sequence));
}

}  // namespace

void AppendUtf8(uint32_t codepoint, std::string* out) {
  if (codepoint <= 0x7F) {
    out->push_back(static_cast<char>(codepoint));
  } else if (codepoint <= 0x7FF) {
    out->push_back(static_cast<char>(0xC0 | (codepoint >> 6)));
    out->push_back(static_cast<char>(0x80 | (codepoint & 0x3F)));
  } else if (codepoint <= 0xFFFF) {
    out->push_back(static_cast<char>(0xE0 | (codepoint >> 12)));
    out->push_back(static_cast<char>(0x80 | ((codepoint >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (codepoint & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (codepoint >> 18)));
    out->push_back(static_cast<char>(0x80 | ((codepoint >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((codepoint >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (codepoint & 0x3F)));
  }
}

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> Utf8Sequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  SplitUtf8(lo, std::min(hi, kMaxCodepoint), &out);
  return out;
}

bool GrammarBuilder::Charge(int64_t elements) {
  if (!status_.ok()) return false;
  num_elements_ += elements;
  if (num_elements_ > limits_.max_elements) {
    Fail(absl::InvalidArgumentError(
        StrCat("the grammar exceeds ", limits_.max_elements,
               " elements (too many alternatives, repetitions or enum values)")));
    return false;
  }
  return true;
}

int32_t GrammarBuilder::NewRule(std::string_view name) {
  if (static_cast<int32_t>(rules_.size()) >= limits_.max_rules) {
    Fail(absl::InvalidArgumentError(StrCat("the grammar exceeds ", limits_.max_rules, " rules")));
    // Keep ids valid: reuse rule 0's slot for the failed build (the result is discarded).
    if (rules_.empty()) {
      rules_.emplace_back();
      names_.emplace_back("failed");
    }
    return 0;
  }
  rules_.emplace_back();
  names_.emplace_back(name);
  return static_cast<int32_t>(rules_.size() - 1);
}

void GrammarBuilder::AddAlternative(int32_t rule, std::vector<Element> sequence) {
  if (!Charge(static_cast<int64_t>(sequence.size()) + 1)) return;
  rules_[rule].push_back(std::move(sequence));
}

Element GrammarBuilder::Bytes(const ByteSet& set) {
  std::string key = ByteSetKey(set);
  auto it = byte_set_ids_.find(key);
  if (it != byte_set_ids_.end()) return {Element::Kind::kBytes, it->second};
  const int32_t id = static_cast<int32_t>(byte_sets_.size());
  byte_sets_.push_back(set);
  byte_set_ids_.emplace(std::move(key), id);
  return {Element::Kind::kBytes, id};
}

Element GrammarBuilder::Byte(uint8_t byte) {
  ByteSet set;
  set.Add(byte);
  return Bytes(set);
}

void GrammarBuilder::AppendLiteral(std::string_view bytes, std::vector<Element>* out) {
  for (char c : bytes) out->push_back(Byte(static_cast<uint8_t>(c)));
}

int32_t GrammarBuilder::Literal(std::string_view bytes) {
  std::vector<Element> sequence;
  AppendLiteral(bytes, &sequence);
  const int32_t rule = NewRule("literal");
  AddAlternative(rule, std::move(sequence));
  return rule;
}

Element GrammarBuilder::CodepointClass(std::vector<std::pair<uint32_t, uint32_t>> ranges,
                                       bool negated) {
  for (auto& [lo, hi] : ranges) {
    hi = std::min(hi, kMaxCodepoint);
    if (lo > hi) std::swap(lo, hi);
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& [lo, hi] : ranges) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> complement;
    uint32_t next = 0;
    for (const auto& [lo, hi] : merged) {
      if (lo > next) complement.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodepoint) complement.emplace_back(next, kMaxCodepoint);
    merged = std::move(complement);
  }
  std::string key;
  for (const auto& [lo, hi] : merged) key += StrCat(lo, "-", hi, ",");
  if (auto it = class_cache_.find(key); it != class_cache_.end()) return it->second;

  ByteSet ascii;
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> multibyte;
  for (const auto& [lo, hi] : merged) {
    for (auto& sequence : Utf8Sequences(lo, hi)) {
      if (sequence.size() == 1) {
        ascii.AddRange(sequence[0].first, sequence[0].second);
      } else {
        multibyte.push_back(std::move(sequence));
      }
    }
  }
  Element result;
  if (multibyte.empty() && !ascii.Empty()) {
    result = Bytes(ascii);
  } else {
    const int32_t rule = NewRule("char_class");
    if (!ascii.Empty()) AddAlternative(rule, {Bytes(ascii)});
    for (const auto& sequence : multibyte) {
      std::vector<Element> elements;
      for (const auto& [lo, hi] : sequence) {
        ByteSet set;
        set.AddRange(lo, hi);
        elements.push_back(Bytes(set));
      }
      AddAlternative(rule, std::move(elements));
    }
    result = Ref(rule);
  }
  class_cache_.emplace(std::move(key), result);
  return result;
}

int32_t GrammarBuilder::Choice(std::string_view name,
                               std::vector<std::vector<Element>> alternatives) {
  const int32_t rule = NewRule(name);
  for (auto& alternative : alternatives) AddAlternative(rule, std::move(alternative));
  return rule;
}

Element GrammarBuilder::Group(std::string_view name, std::vector<Element> sequence) {
  if (sequence.size() == 1) return sequence[0];
  const int32_t rule = NewRule(name);
  AddAlternative(rule, std::move(sequence));
  return Ref(rule);
}

int32_t GrammarBuilder::Repeat(std::string_view name, std::vector<Element> item,
                               int32_t min_count, int32_t max_count) {
  const int32_t rule = NewRule(name);
  if (min_count < 0 || min_count > limits_.max_repeat || max_count > limits_.max_repeat) {
    Fail(absl::InvalidArgumentError(StrCat("a repetition count above ", limits_.max_repeat)));
    return rule;
  }
  if (max_count >= 0 && max_count < min_count) {
    Fail(absl::InvalidArgumentError(
        StrCat("a repetition whose maximum ", max_count, " is below its minimum ", min_count)));
    return rule;
  }
  const Element one = Group(StrCat(name, "_item"), std::move(item));
  std::vector<Element> sequence(static_cast<size_t>(min_count), one);
  if (max_count < 0) {
    // star ::= one star | ""
    const int32_t star = NewRule(StrCat(name, "_star"));
    AddAlternative(star, {one, Ref(star)});
    AddAlternative(star, {});
    sequence.push_back(Ref(star));
  } else if (max_count > min_count) {
    // opt_k ::= one opt_{k-1} | "": at most k more.
    int32_t previous = -1;
    for (int32_t k = 1; k <= max_count - min_count && status_.ok(); ++k) {
      const int32_t optional = NewRule(StrCat(name, "_opt"));
      if (previous < 0) {
        AddAlternative(optional, {one});
      } else {
        AddAlternative(optional, {one, Ref(previous)});
      }
      AddAlternative(optional, {});
      previous = optional;
    }
    sequence.push_back(Ref(previous));
  }
  AddAlternative(rule, std::move(sequence));
  return rule;
}

absl::StatusOr<Grammar> GrammarBuilder::Build(int32_t root) && {
  if (!status_.ok()) return status_;
  const int32_t num_rules = static_cast<int32_t>(rules_.size());
  if (root < 0 || root >= num_rules) return absl::InvalidArgumentError("the grammar has no root");
  // Reachable rules must have alternatives.
  std::vector<uint8_t> reachable(num_rules, 0);
  std::vector<int32_t> work = {root};
  reachable[root] = 1;
  while (!work.empty()) {
    const int32_t rule = work.back();
    work.pop_back();
    if (rules_[rule].empty() && names_[rule] != "char_class") {
      return absl::InvalidArgumentError(StrCat("rule '", names_[rule], "' is used but not defined"));
    }
    for (const auto& alternative : rules_[rule]) {
      for (const Element& element : alternative) {
        if (element.kind == Element::Kind::kRule && !reachable[element.id]) {
          reachable[element.id] = 1;
          work.push_back(element.id);
        }
      }
    }
  }
  // Nullable rules (a fixpoint), then left recursion: rule A reaches rule B at its left edge when
  // some alternative of A references B after nothing but nullable rules.
  std::vector<uint8_t> nullable(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t rule = 0; rule < num_rules; ++rule) {
      if (nullable[rule]) continue;
      for (const auto& alternative : rules_[rule]) {
        const bool all = std::all_of(alternative.begin(), alternative.end(), [&](const Element& e) {
          return e.kind == Element::Kind::kRule && nullable[e.id];
        });
        if (all) {
          nullable[rule] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  // Left edges: A -> B when an alternative of A references B after only nullable rules. A cycle
  // of left edges loops without consuming input; the matcher's closure stops such a loop when it
  // pushes nothing (every reference of the cycle is the last of its alternative: a tail call that
  // revisits the same stack), but not when a reference pushes a frame. So a strongly connected
  // component of left edges that holds a non-tail edge is refused.
  struct Edge {
    int32_t target;
    bool tail;
  };
  std::vector<std::vector<Edge>> left_edges(num_rules);
  for (int32_t rule = 0; rule < num_rules; ++rule) {
    for (const auto& alternative : rules_[rule]) {
      for (size_t k = 0; k < alternative.size(); ++k) {
        const Element& element = alternative[k];
        if (element.kind != Element::Kind::kRule) break;
        left_edges[rule].push_back({element.id, k + 1 == alternative.size()});
        if (!nullable[element.id]) break;
      }
    }
  }
  // Kosaraju, iteratively: finishing order on the graph, then components on the reversed graph.
  std::vector<int32_t> order;
  std::vector<uint8_t> visited(num_rules, 0);
  for (int32_t start = 0; start < num_rules; ++start) {
    if (visited[start]) continue;
    std::vector<std::pair<int32_t, size_t>> path = {{start, 0}};
    visited[start] = 1;
    while (!path.empty()) {
      auto& [rule, next] = path.back();
      if (next < left_edges[rule].size()) {
        const int32_t target = left_edges[rule][next++].target;
        if (!visited[target]) {
          visited[target] = 1;
          path.emplace_back(target, 0);
        }
      } else {
        order.push_back(rule);
        path.pop_back();
      }
    }
  }
  std::vector<std::vector<int32_t>> reversed(num_rules);
  for (int32_t rule = 0; rule < num_rules; ++rule) {
    for (const Edge& edge : left_edges[rule]) reversed[edge.target].push_back(rule);
  }
  std::vector<int32_t> component(num_rules, -1);
  int32_t num_components = 0;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (component[*it] >= 0) continue;
    std::vector<int32_t> work = {*it};
    component[*it] = num_components;
    while (!work.empty()) {
      const int32_t rule = work.back();
      work.pop_back();
      for (int32_t source : reversed[rule]) {
        if (component[source] < 0) {
          component[source] = num_components;
          work.push_back(source);
        }
      }
    }
    ++num_components;
  }
  for (int32_t rule = 0; rule < num_rules; ++rule) {
    if (!reachable[rule]) continue;
    for (const Edge& edge : left_edges[rule]) {
      if (!edge.tail && component[edge.target] == component[rule]) {
        return absl::InvalidArgumentError(
            StrCat("left recursion through rule '", names_[edge.target],
                   "' (a rule that can reach itself without consuming input)"));
      }
    }
  }

  Grammar grammar;
  grammar.root = root;
  grammar.byte_sets = std::move(byte_sets_);
  grammar.rule_names = std::move(names_);
  grammar.rule_alternatives.resize(num_rules);
  grammar.code.reserve(static_cast<size_t>(num_elements_));
  for (int32_t rule = 0; rule < num_rules; ++rule) {
    for (const auto& alternative : rules_[rule]) {
      grammar.rule_alternatives[rule].push_back(static_cast<int32_t>(grammar.code.size()));
      for (const Element& element : alternative) {
        grammar.code.push_back(element.kind == Element::Kind::kBytes ? element.id
                                                                     : -(element.id + 2));
      }
      grammar.code.push_back(Grammar::kEnd);
    }
  }
  return grammar;
}

}  // namespace lmserve::engine::structured
