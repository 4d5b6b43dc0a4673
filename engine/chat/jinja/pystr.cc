#include "engine/chat/jinja/pystr.h"

#include <algorithm>

namespace lmserve::engine::jinja {
namespace {

constexpr char32_t kInvalid = 0xFFFFFFFF;

bool IsAsciiUpper(char32_t c) { return c >= 'A' && c <= 'Z'; }
bool IsAsciiLower(char32_t c) { return c >= 'a' && c <= 'z'; }

// Whether Python considers the code point cased (has an upper/lower form). Exact for ASCII;
// Latin, Greek and Cyrillic letters approximated by block, other scripts uncased.
bool IsCased(char32_t c) {
  if (c < 0x80) return IsAsciiUpper(c) || IsAsciiLower(c);
  if (c >= 0xC0 && c <= 0x24F) return c != 0xD7 && c != 0xF7;
  if (c >= 0x370 && c <= 0x3FF) return true;
  if (c >= 0x400 && c <= 0x52F) return true;
  return false;
}

void AppendCodePoint(std::string_view text, size_t offset, size_t length, char32_t mapped,
                     char32_t original, std::string* out) {
  if (mapped == original) {
    out->append(text.substr(offset, length));
  } else {
    AppendUtf8(mapped, out);
  }
}

char32_t ToUpper(char32_t c) { return IsAsciiLower(c) ? c - 32 : c; }
char32_t ToLower(char32_t c) { return IsAsciiUpper(c) ? c + 32 : c; }

template <typename Map>
std::string MapCodePoints(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    const char32_t c = DecodeUtf8At(text, offset, &length);
    AppendCodePoint(text, offset, length, map(c), c, &out);
    offset += length;
  }
  return out;
}

bool InChars(char32_t c, std::string_view chars) {
  size_t offset = 0;
  while (offset < chars.size()) {
    size_t length = 0;
    if (DecodeUtf8At(chars, offset, &length) == c) return true;
    offset += length;
  }
  return false;
}

}  // namespace

char32_t DecodeUtf8At(std::string_view text, size_t offset, size_t* length) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(offset);
  *length = 1;
  if (lead < 0x80) return lead;
  size_t count = 0;
  char32_t c = 0;
  if ((lead & 0xE0) == 0xC0) {
    count = 1;
    c = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    count = 2;
    c = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    count = 3;
    c = lead & 0x07;
  } else {
    return kInvalid;
  }
  if (offset + count >= text.size()) return kInvalid;  // truncated sequence
  for (size_t i = 1; i <= count; ++i) {
    const unsigned char next = byte(offset + i);
    if ((next & 0xC0) != 0x80) return kInvalid;
    c = (c << 6) | (next & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static constexpr char32_t kMinimum[] = {0, 0x80, 0x800, 0x10000};
  if (c < kMinimum[count] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return kInvalid;
  *length = count + 1;
  return c;
}

std::vector<size_t> CodePointOffsets(std::string_view text) {
  std::vector<size_t> offsets;
  offsets.reserve(text.size() + 1);
  size_t offset = 0;
  while (offset < text.size()) {
    offsets.push_back(offset);
    size_t length = 0;
    DecodeUtf8At(text, offset, &length);
    offset += length;
  }
  offsets.push_back(text.size());
  return offsets;
}

int64_t CodePointCount(std::string_view text) {
  int64_t count = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    size_t length = 0;
    DecodeUtf8At(text, offset, &length);
    offset += length;
    ++count;
  }
  return count;
}

bool IsPySpace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string PyStrip(std::string_view text, std::optional<std::string_view> chars, StripSide side) {
  const std::vector<size_t> offsets = CodePointOffsets(text);
  const size_t count = offsets.size() - 1;
  const auto strippable = [&](size_t i) {
    size_t length = 0;
    const char32_t c = DecodeUtf8At(text, offsets[i], &length);
    return chars.has_value() ? InChars(c, *chars) : IsPySpace(c);
  };
  size_t begin = 0;
  size_t end = count;
  if (side != StripSide::kRight) {
    while (begin < end && strippable(begin)) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strippable(end - 1)) --end;
  }
  return std::string(text.substr(offsets[begin], offsets[end] - offsets[begin]));
}

std::vector<std::string> PySplit(std::string_view text, std::optional<std::string_view> separator,
                                 int64_t max_split) {
  std::vector<std::string> parts;
  if (separator.has_value()) {
    size_t start = 0;
    while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
      const size_t found = text.find(*separator, start);
      if (found == std::string_view::npos) break;
      parts.emplace_back(text.substr(start, found - start));
      start = found + separator->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  // Whitespace splitting: runs of whitespace separate, leading and trailing runs are dropped.
  const std::vector<size_t> offsets = CodePointOffsets(text);
  const size_t count = offsets.size() - 1;
  const auto space = [&](size_t i) {
    size_t length = 0;
    return IsPySpace(DecodeUtf8At(text, offsets[i], &length));
  };
  size_t i = 0;
  while (true) {
    while (i < count && space(i)) ++i;
    if (i == count) break;
    if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
      // The rest, with trailing whitespace removed, is the last part.
      size_t end = count;
      while (end > i && space(end - 1)) --end;
      parts.emplace_back(text.substr(offsets[i], offsets[end] - offsets[i]));
      break;
    }
    const size_t start = i;
    while (i < count && !space(i)) ++i;
    parts.emplace_back(text.substr(offsets[start], offsets[i] - offsets[start]));
  }
  return parts;
}

std::string PyReplace(std::string_view text, std::string_view from, std::string_view to,
                      int64_t count) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {
    const std::vector<size_t> offsets = CodePointOffsets(text);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(to);
        ++done;
      }
      out.append(text.substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    if (count < 0 || done < count) out.append(to);
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t found = text.find(from, start);
    if (found == std::string_view::npos) break;
    out.append(text.substr(start, found - start));
    out.append(to);
    start = found + from.size();
    ++done;
  }
  out.append(text.substr(start));
  return out;
}

std::string PyUpper(std::string_view text) { return MapCodePoints(text, ToUpper); }
std::string PyLower(std::string_view text) { return MapCodePoints(text, ToLower); }

std::string PyTitle(std::string_view text) {
  bool previous_cased = false;
  return MapCodePoints(text, [&](char32_t c) {
    const char32_t mapped = previous_cased ? ToLower(c) : ToUpper(c);
    previous_cased = IsCased(c);
    return mapped;
  });
}

std::string JinjaTitle(std::string_view text) {
  // "".join(w[0].upper() + w[1:].lower() for w in re.split(r"([-\s({\[<]+)", text) if w)
  bool word_start = true;
  return MapCodePoints(text, [&](char32_t c) {
    const bool boundary = IsPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (boundary) {
      word_start = true;
      return c;
    }
    const char32_t mapped = word_start ? ToUpper(c) : ToLower(c);
    word_start = false;
    return mapped;
  });
}

std::string PyCapitalize(std::string_view text) {
  bool first = true;
  return MapCodePoints(text, [&](char32_t c) {
    const char32_t mapped = first ? ToUpper(c) : ToLower(c);
    first = false;
    return mapped;
  });
}

std::vector<int64_t> SliceIndices(int64_t length, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  // CPython's PySlice_AdjustIndices.
  const auto adjust = [&](std::optional<int64_t> value, int64_t fallback) {
    if (!value.has_value()) return fallback;
    int64_t v = *value;
    if (v < 0) {
      v += length;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= length) {
      v = step < 0 ? length - 1 : length;
    }
    return v;
  };
  const int64_t begin = adjust(start, step < 0 ? length - 1 : 0);
  const int64_t end = adjust(stop, step < 0 ? -1 : length);
  std::vector<int64_t> indices;
  if (step > 0) {
    for (int64_t i = begin; i < end; i += step) indices.push_back(i);
  } else {
    for (int64_t i = begin; i > end; i += step) indices.push_back(i);
  }
  return indices;
}

}  // namespace lmserve::engine::jinja
