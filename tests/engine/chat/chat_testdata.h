// Test data of the chat-template tests: files under tests/engine/chat/testdata/, written by
// make_testdata.py from Python's jinja2 (the outside reference).

#ifndef LMSERVE_TESTS_ENGINE_CHAT_CHAT_TESTDATA_H_
#define LMSERVE_TESTS_ENGINE_CHAT_CHAT_TESTDATA_H_

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine::testdata {

inline std::string TestdataPath(const std::string& name) {
  return std::string(LMSERVE_SOURCE_DIR) + "/tests/engine/chat/testdata/" + name;
}

inline std::string ReadTestdata(const std::string& name) {
  std::ifstream in(TestdataPath(name), std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << TestdataPath(name);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline nlohmann::ordered_json ReadTestdataJson(const std::string& name) {
  nlohmann::ordered_json json =
      nlohmann::ordered_json::parse(ReadTestdata(name), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(json.is_discarded()) << name << " is not valid JSON";
  return json;
}

// The time strftime_now() returns in the reference renders (2024-09-05 12:00:00 UTC).
inline std::chrono::system_clock::time_point ReferenceNow() {
  return std::chrono::system_clock::time_point(std::chrono::seconds(1725537600));
}

}  // namespace lmserve::engine::testdata

#endif  // LMSERVE_TESTS_ENGINE_CHAT_CHAT_TESTDATA_H_
