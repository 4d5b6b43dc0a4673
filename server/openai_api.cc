#include "server/openai_api.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <variant>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"

namespace lmserve::server {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(std::string_view field, std::string_view message) {
  return absl::InvalidArgumentError(StrCat(field, ": ", message));
}

std::string_view TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    default:
      return "an unknown value";
  }
}

absl::Status WrongType(std::string_view field, std::string_view want, const Json& got) {
  return Invalid(field, StrCat("must be ", want, ", got ", TypeName(got)));
}

// The value of `key`, or nullptr when absent or null (OpenAI's optional fields accept null).
const Json* Find(const Json& object, std::string_view key) {
  auto it = object.find(std::string(key));
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<bool>> GetBool(const Json& object, std::string_view key) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::optional<bool>();
  if (!value->is_boolean()) return WrongType(key, "a boolean", *value);
  return std::optional<bool>(value->get<bool>());
}

absl::StatusOr<std::optional<double>> GetNumber(const Json& object, std::string_view key) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::optional<double>();
  if (!value->is_number()) return WrongType(key, "a number", *value);
  return std::optional<double>(value->get<double>());
}

// An integer: a JSON integer, or a number with no fractional part (2.0), within [min, max].
absl::StatusOr<int64_t> ToInteger(std::string_view field, const Json& value, int64_t min,
                                  int64_t max) {
  if (value.is_number_unsigned()) {
    const uint64_t number = value.get<uint64_t>();
    if (number > static_cast<uint64_t>(max)) {
      return Invalid(field, StrCat("must be at most ", max, ", got ", number));
    }
    return static_cast<int64_t>(number);
  }
  if (value.is_number_integer()) {
    const int64_t number = value.get<int64_t>();
    if (number < min || number > max) {
      return Invalid(field, StrCat("must be in [", min, ", ", max, "], got ", number));
    }
    return number;
  }
  if (value.is_number_float()) {
    const double number = value.get<double>();
    if (!std::isfinite(number) || std::trunc(number) != number) {
      return Invalid(field, StrCat("must be an integer, got ", value.dump()));
    }
    if (number < static_cast<double>(min) || number > static_cast<double>(max)) {
      return Invalid(field, StrCat("must be in [", min, ", ", max, "], got ", value.dump()));
    }
    return static_cast<int64_t>(number);
  }
  return WrongType(field, "an integer", value);
}

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

absl::StatusOr<std::optional<int64_t>> GetInt(const Json& object, std::string_view key,
                                              int64_t min = kInt32Min, int64_t max = kInt32Max) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::optional<int64_t>();
  LMSERVE_ASSIGN_OR_RETURN(int64_t number, ToInteger(key, *value, min, max));
  return std::optional<int64_t>(number);
}

absl::StatusOr<std::optional<std::string>> GetString(const Json& object, std::string_view key) {
  const Json* value = Find(object, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) return WrongType(key, "a string", *value);
  return std::optional<std::string>(value->get<std::string>());
}

// A list of token ids (each in [0, 2^31)); the vocabulary is checked by request_convert.
absl::Status GetTokenIds(std::string_view field, const Json& value,
                         google::protobuf::RepeatedField<int32_t>* out) {
  if (!value.is_array()) return WrongType(field, "an array of token ids", value);
  out->Reserve(static_cast<int>(value.size()));
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& id = value[i];
    if (!id.is_number_integer() && !id.is_number_unsigned()) {
      return Invalid(field,
                     StrCat("element ", i, " must be a token id (an integer), got ", TypeName(id)));
    }
    LMSERVE_ASSIGN_OR_RETURN(int64_t number,
                             ToInteger(StrCat(field, "[", i, "]"), id, 0, kInt32Max));
    out->Add(static_cast<int32_t>(number));
  }
  return absl::OkStatus();
}

// Fields this server refuses: present and not null (or not an allowed value).
absl::Status CheckRefused(const Json& object) {
  for (std::string_view key : {"functions", "function_call"}) {
    if (Find(object, key) != nullptr) {
      return Invalid(key, "the legacy function-calling fields are not supported: use tools");
    }
  }
  for (std::string_view key : {"guided_choice", "structured_outputs", "guided_decoding_backend"}) {
    if (Find(object, key) != nullptr) {
      return Invalid(key,
                     "not supported: use response_format, guided_json, guided_regex or "
                     "guided_grammar");
    }
  }
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> include_stop,
                           GetBool(object, "include_stop_str_in_output"));
  if (include_stop.value_or(false)) {
    return Invalid("include_stop_str_in_output", "not supported: stop strings are never returned");
  }
  return absl::OkStatus();
}

// `value` as compact JSON text, in the key order of the same value in `ordered` (the body parsed
// with its order) at `path` when it is there and the same value; else in `value`'s own order. (A
// body with duplicate keys can hold different values in the two parses.)
std::string OrderedDump(const Json& value, const nlohmann::ordered_json* ordered,
                        std::initializer_list<std::variant<std::string_view, size_t>> path) {
  const nlohmann::ordered_json* node = ordered;
  for (const auto& step : path) {
    if (node == nullptr) break;
    if (const auto* key = std::get_if<std::string_view>(&step)) {
      auto it = node->is_object() ? node->find(std::string(*key)) : node->end();
      node = node->is_object() && it != node->end() ? &*it : nullptr;
    } else {
      const size_t index = std::get<size_t>(step);
      node = node->is_array() && index < node->size() ? &(*node)[index] : nullptr;
    }
  }
  if (node != nullptr && Json::parse(node->dump(), nullptr, false) == value) return node->dump();
  return value.dump();
}

// Structured output: OpenAI's response_format, or vLLM's guided_json, guided_regex and
// guided_grammar (at most one of them), into sampling.structured. `ordered` is the body parsed
// with its objects' key order, so that a schema's properties keep the client's order.
absl::Status ParseStructuredOutput(const Json& object, const nlohmann::ordered_json* ordered,
                                   GenerationRequest* request, v1::SamplingParams* sampling) {
  std::vector<std::string_view> given;
  for (std::string_view key : {"response_format", "guided_json", "guided_regex", "guided_grammar"}) {
    if (Find(object, key) != nullptr) given.push_back(key);
  }
  if (given.empty()) return absl::OkStatus();
  if (given.size() > 1) {
    return Invalid(given[1], StrCat("only one of response_format, guided_json, guided_regex and "
                                    "guided_grammar may be given, got ", given[0], " too"));
  }
  const std::string_view key = given[0];
  request->structured_field = std::string(key);
  v1::StructuredOutput* structured = sampling->mutable_structured();
  const Json& value = *Find(object, key);
  if (key == "guided_regex" || key == "guided_grammar") {
    if (!value.is_string()) return WrongType(key, "a string", value);
    if (key == "guided_regex") {
      structured->set_regex(value.get<std::string>());
    } else {
      structured->set_grammar(value.get<std::string>());
    }
    return absl::OkStatus();
  }
  if (key == "guided_json") {
    if (value.is_string()) {
      structured->set_json_schema(value.get<std::string>());
    } else if (value.is_object()) {
      structured->set_json_schema(OrderedDump(value, ordered, {key}));
    } else {
      return WrongType(key, "a JSON schema (an object or a string)", value);
    }
    return absl::OkStatus();
  }
  if (!value.is_object()) return WrongType("response_format", "an object", value);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(value, "type"));
  if (!type.has_value()) return Invalid("response_format.type", "missing");
  if (*type == "text") {
    sampling->clear_structured();
    request->structured_field.clear();
  } else if (*type == "json_object") {
    structured->set_json_object(true);
  } else if (*type == "json_schema") {
    const Json* json_schema = Find(value, "json_schema");
    if (json_schema == nullptr) return Invalid("response_format.json_schema", "missing");
    if (!json_schema->is_object()) {
      return WrongType("response_format.json_schema", "an object", *json_schema);
    }
    LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(*json_schema, "name"));
    LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> strict, GetBool(*json_schema, "strict"));
    (void)name;    // accepted, not used
    (void)strict;  // the output always follows the schema
    const Json* schema = Find(*json_schema, "schema");
    if (schema == nullptr) {
      structured->set_json_object(true);  // OpenAI: no schema, any JSON object
    } else if (schema->is_object() || schema->is_boolean()) {
      structured->set_json_schema(
          OrderedDump(*schema, ordered, {key, std::string_view("json_schema"),
                                         std::string_view("schema")}));
    } else {
      return WrongType("response_format.json_schema.schema", "an object", *schema);
    }
  } else {
    return Invalid("response_format.type",
                   StrCat("must be text, json_object or json_schema, got '", type->substr(0, 40),
                          "'"));
  }
  return absl::OkStatus();
}

// The sampling fields both endpoints share, into `sampling`.
absl::Status ParseSampling(const Json& object, OpenAiEndpoint endpoint, GenerationRequest* request,
                           v1::SamplingParams* sampling) {
  // max_tokens (chat: max_completion_tokens first, as OpenAI deprecates max_tokens there).
  std::optional<int64_t> max_tokens;
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    LMSERVE_ASSIGN_OR_RETURN(max_tokens, GetInt(object, "max_completion_tokens"));
    request->uses_max_completion_tokens = max_tokens.has_value();
  }
  if (!max_tokens.has_value()) {
    LMSERVE_ASSIGN_OR_RETURN(max_tokens, GetInt(object, "max_tokens"));
  }
  if (max_tokens.has_value()) sampling->set_max_tokens(static_cast<int32_t>(*max_tokens));

  LMSERVE_ASSIGN_OR_RETURN(std::optional<double> temperature, GetNumber(object, "temperature"));
  if (temperature.has_value()) sampling->set_temperature(static_cast<float>(*temperature));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<double> top_p, GetNumber(object, "top_p"));
  if (top_p.has_value()) sampling->set_top_p(static_cast<float>(*top_p));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, GetInt(object, "top_k"));
  if (top_k.has_value()) sampling->set_top_k(*top_k == -1 ? 0 : static_cast<int32_t>(*top_k));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<double> min_p, GetNumber(object, "min_p"));
  if (min_p.has_value()) sampling->set_min_p(static_cast<float>(*min_p));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<double> presence, GetNumber(object, "presence_penalty"));
  if (presence.has_value()) sampling->set_presence_penalty(static_cast<float>(*presence));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<double> frequency, GetNumber(object, "frequency_penalty"));
  if (frequency.has_value()) sampling->set_frequency_penalty(static_cast<float>(*frequency));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<double> repetition,
                           GetNumber(object, "repetition_penalty"));
  if (repetition.has_value()) sampling->set_repetition_penalty(static_cast<float>(*repetition));

  LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(object, "n"));
  if (n.has_value()) sampling->set_n(static_cast<int32_t>(*n));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, GetInt(object, "best_of"));
  if (best_of.has_value() && *best_of != n.value_or(1)) {
    return Invalid("best_of", "only best_of equal to n is supported");
  }
  // Seeds: any 64-bit integer, negative ones taken as their two's complement (as vLLM's range).
  if (const Json* seed = Find(object, "seed"); seed != nullptr) {
    if (seed->is_number_unsigned()) {
      sampling->set_seed(seed->get<uint64_t>());
    } else if (seed->is_number_integer()) {
      sampling->set_seed(static_cast<uint64_t>(seed->get<int64_t>()));
    } else {
      return WrongType("seed", "an integer", *seed);
    }
  }

  if (const Json* stop = Find(object, "stop"); stop != nullptr) {
    if (stop->is_string()) {
      sampling->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          return Invalid("stop",
                         StrCat("element ", i, " must be a string, got ", TypeName((*stop)[i])));
        }
        sampling->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *stop);
    }
  }
  if (const Json* ids = Find(object, "stop_token_ids"); ids != nullptr) {
    LMSERVE_RETURN_IF_ERROR(
        GetTokenIds("stop_token_ids", *ids, sampling->mutable_stop_token_ids()));
  }
  if (const Json* bias = Find(object, "logit_bias"); bias != nullptr) {
    if (!bias->is_object()) return WrongType("logit_bias", "an object", *bias);
    for (const auto& [key, value] : bias->items()) {
      std::optional<int64_t> id = ParseInt<int64_t>(key);
      if (!id.has_value() || *id < 0 || *id > kInt32Max) {
        return Invalid("logit_bias", StrCat("the key '", key.substr(0, 40), "' is not a token id"));
      }
      if (!value.is_number()) {
        return Invalid("logit_bias", StrCat("the bias of token ", *id, " must be a number, got ",
                                            TypeName(value)));
      }
      (*sampling->mutable_logit_bias())[static_cast<int32_t>(*id)] =
          static_cast<float>(value.get<double>());
    }
  }

  // logprobs: completions "logprobs": N; chat "logprobs": true with "top_logprobs": N.
  if (endpoint == OpenAiEndpoint::kCompletions) {
    LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, GetInt(object, "logprobs"));
    if (logprobs.has_value()) request->logprobs = static_cast<int32_t>(*logprobs);
  } else {
    LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(object, "logprobs"));
    LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> top, GetInt(object, "top_logprobs"));
    if (top.has_value() && !logprobs.value_or(false)) {
      return Invalid("top_logprobs", "needs \"logprobs\": true");
    }
    if (logprobs.value_or(false)) request->logprobs = static_cast<int32_t>(top.value_or(0));
  }
  if (request->logprobs.has_value()) {
    if (*request->logprobs < 0) {
      return Invalid(endpoint == OpenAiEndpoint::kCompletions ? "logprobs" : "top_logprobs",
                     StrCat("must be >= 0, got ", *request->logprobs));
    }
    // The engine lists the top N beside the chosen token; N = 0 asks for the chosen one only, which
    // the engine gives with one more (not shown).
    sampling->set_logprobs(std::max(1, *request->logprobs));
  }

  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, GetBool(object, "ignore_eos"));
  sampling->set_ignore_eos(ignore_eos.value_or(false));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens, GetInt(object, "min_tokens"));
  if (min_tokens.has_value()) sampling->set_min_tokens(static_cast<int32_t>(*min_tokens));
  return absl::OkStatus();
}

// One chat message, OpenAI's shape, into the API's: role, content, an assistant's tool_calls, a
// tool message's tool_call_id and name.
absl::Status ParseChatMessage(const Json& message, int index, v1::ChatMessage* out) {
  const std::string field = StrCat("messages[", index, "]");
  if (!message.is_object()) return WrongType(field, "an object", message);
  const Json* role = Find(message, "role");
  if (role == nullptr) return Invalid(StrCat(field, ".role"), "missing");
  if (!role->is_string()) return WrongType(StrCat(field, ".role"), "a string", *role);
  std::string role_name = role->get<std::string>();
  if (role_name == "function") {
    return Invalid(StrCat(field, ".role"), "'function' messages are legacy: use 'tool'");
  }
  if (const Json* calls = Find(message, "tool_calls"); calls != nullptr) {
    if (!calls->is_array()) return WrongType(StrCat(field, ".tool_calls"), "an array", *calls);
    for (size_t k = 0; k < calls->size(); ++k) {
      const Json& call = (*calls)[k];
      const std::string call_field = StrCat(field, ".tool_calls[", k, "]");
      if (!call.is_object()) return WrongType(call_field, "an object", call);
      LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> id, GetString(call, "id"));
      const Json* function = Find(call, "function");
      if (function == nullptr) return Invalid(StrCat(call_field, ".function"), "missing");
      if (!function->is_object()) {
        return WrongType(StrCat(call_field, ".function"), "an object", *function);
      }
      LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(*function, "name"));
      if (!name.has_value()) return Invalid(StrCat(call_field, ".function.name"), "missing");
      v1::ToolCall* out_call = out->add_tool_calls();
      out_call->set_id(id.value_or(""));
      out_call->set_name(*name);
      if (const Json* arguments = Find(*function, "arguments"); arguments != nullptr) {
        out_call->set_arguments(arguments->is_string() ? arguments->get<std::string>()
                                                       : arguments->dump());
      } else {
        out_call->set_arguments("{}");
      }
    }
  }
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> tool_call_id,
                           GetString(message, "tool_call_id"));
  if (tool_call_id.has_value()) out->set_tool_call_id(*tool_call_id);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(message, "name"));
  if (name.has_value()) out->set_name(*name);
  if (Find(message, "function_call") != nullptr) {
    return Invalid(StrCat(field, ".function_call"), "legacy function calling: use tool_calls");
  }
  // OpenAI's "developer" messages are its newer name for system messages; chat templates know
  // "system".
  if (role_name == "developer") role_name = "system";
  out->set_role(std::move(role_name));
  const Json* content = Find(message, "content");
  if (content == nullptr) {
    if (out->role() == "assistant") return absl::OkStatus();  // an empty assistant turn
    return Invalid(StrCat(field, ".content"), "missing");
  }
  if (content->is_string()) {
    out->set_content(content->get<std::string>());
    return absl::OkStatus();
  }
  if (!content->is_array()) {
    return WrongType(StrCat(field, ".content"), "a string or an array of content parts", *content);
  }
  // Text parts, joined by newlines (as vLLM joins them).
  std::string text;
  for (size_t j = 0; j < content->size(); ++j) {
    const Json& part = (*content)[j];
    const std::string part_field = StrCat(field, ".content[", j, "]");
    if (!part.is_object()) return WrongType(part_field, "an object", part);
    LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(part, "type"));
    if (!type.has_value()) return Invalid(StrCat(part_field, ".type"), "missing");
    if (*type != "text") {
      return Invalid(StrCat(part_field, ".type"),
                     StrCat("'", type->substr(0, 40),
                            "' parts are not supported: this server serves text only"));
    }
    const Json* part_text = Find(part, "text");
    if (part_text == nullptr) return Invalid(StrCat(part_field, ".text"), "missing");
    if (!part_text->is_string()) {
      return WrongType(StrCat(part_field, ".text"), "a string", *part_text);
    }
    if (j > 0) text += "\n";
    text += part_text->get<std::string>();
  }
  out->set_content(std::move(text));
  return absl::OkStatus();
}

// google.protobuf.Value of a JSON value (chat_template_kwargs).
void ToProtoValue(const Json& value, google::protobuf::Value* out) {
  switch (value.type()) {
    case Json::value_t::boolean:
      out->set_bool_value(value.get<bool>());
      break;
    case Json::value_t::string:
      out->set_string_value(value.get<std::string>());
      break;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      out->set_number_value(value.get<double>());
      break;
    case Json::value_t::object:
      for (const auto& [key, member] : value.items()) {
        ToProtoValue(member, &(*out->mutable_struct_value()->mutable_fields())[key]);
      }
      out->mutable_struct_value();
      break;
    case Json::value_t::array:
      out->mutable_list_value();
      for (const Json& element : value)
        ToProtoValue(element, out->mutable_list_value()->add_values());
      break;
    default:
      out->set_null_value(google::protobuf::NULL_VALUE);
      break;
  }
}

// OpenAI's tools and tool_choice. `ordered` is the body with its key order (parameters' property
// order is the generated arguments' order), or null when there are no tools.
absl::Status ParseTools(const Json& object, const nlohmann::ordered_json* ordered,
                        v1::ChatRequest* chat) {
  const Json* tools = Find(object, "tools");
  if (tools != nullptr) {
    if (!tools->is_array()) return WrongType("tools", "an array", *tools);
    for (size_t k = 0; k < tools->size(); ++k) {
      const Json& tool = (*tools)[k];
      const std::string field = StrCat("tools[", k, "]");
      if (!tool.is_object()) return WrongType(field, "an object", tool);
      LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> type, GetString(tool, "type"));
      if (type.value_or("function") != "function") {
        return Invalid(StrCat(field, ".type"), "only \"function\" tools are supported");
      }
      const Json* function = Find(tool, "function");
      if (function == nullptr) return Invalid(StrCat(field, ".function"), "missing");
      if (!function->is_object()) {
        return WrongType(StrCat(field, ".function"), "an object", *function);
      }
      LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(*function, "name"));
      if (!name.has_value()) return Invalid(StrCat(field, ".function.name"), "missing");
      LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> description,
                               GetString(*function, "description"));
      LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> strict, GetBool(*function, "strict"));
      (void)strict;  // a forced call always follows the schema
      v1::Tool* out = chat->add_tools();
      out->set_name(*name);
      out->set_description(description.value_or(""));
      if (const Json* parameters = Find(*function, "parameters"); parameters != nullptr) {
        if (!parameters->is_object()) {
          return WrongType(StrCat(field, ".function.parameters"), "an object", *parameters);
        }
        out->set_parameters(OrderedDump(*parameters, ordered,
                                        {std::string_view("tools"), k,
                                         std::string_view("function"),
                                         std::string_view("parameters")}));
      }
    }
  }
  const Json* choice = Find(object, "tool_choice");
  if (choice == nullptr) return absl::OkStatus();
  if (choice->is_string()) {
    const std::string mode = choice->get<std::string>();
    if (mode != "auto" && mode != "none" && mode != "required") {
      return Invalid("tool_choice", StrCat("must be auto, none, required or a function, got '",
                                           mode.substr(0, 40), "'"));
    }
    chat->set_tool_choice(mode);
  } else if (choice->is_object()) {
    const Json* function = Find(*choice, "function");
    if (function == nullptr || !function->is_object()) {
      return Invalid("tool_choice", "must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(*function, "name"));
    if (!name.has_value()) return Invalid("tool_choice.function.name", "missing");
    chat->set_tool_choice("function");
    chat->set_tool_choice_function(*name);
  } else {
    return WrongType("tool_choice", "a string or an object", *choice);
  }
  if (chat->tools_size() == 0 && chat->tool_choice() != "auto" && chat->tool_choice() != "none") {
    return Invalid("tool_choice", "needs tools");
  }
  return absl::OkStatus();
}

absl::Status ParseChatFields(const Json& object, v1::ChatRequest* chat) {
  const Json* messages = Find(object, "messages");
  if (messages == nullptr) return Invalid("messages", "missing");
  if (!messages->is_array()) return WrongType("messages", "an array", *messages);
  for (size_t i = 0; i < messages->size(); ++i) {
    LMSERVE_RETURN_IF_ERROR(
        ParseChatMessage((*messages)[i], static_cast<int>(i), chat->add_messages()));
  }
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> add_generation_prompt,
                           GetBool(object, "add_generation_prompt"));
  if (add_generation_prompt.has_value()) chat->set_add_generation_prompt(*add_generation_prompt);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> continue_final,
                           GetBool(object, "continue_final_message"));
  if (continue_final.value_or(false)) {
    return Invalid("continue_final_message", "not supported by this server");
  }
  if (Find(object, "chat_template") != nullptr) {
    return Invalid("chat_template",
                   "not accepted per request: the server's template is set by --chat-template");
  }
  if (const Json* kwargs = Find(object, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return WrongType("chat_template_kwargs", "an object", *kwargs);
    for (const auto& [key, value] : kwargs->items()) {
      ToProtoValue(value, &(*chat->mutable_chat_template_kwargs()->mutable_fields())[key]);
    }
  }
  return absl::OkStatus();
}

absl::Status ParsePrompts(const Json& object, bool add_special,
                          std::optional<bool> add_special_given,
                          std::vector<v1::CompleteRequest>* prompts) {
  const Json* prompt = Find(object, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "missing");
  auto add = [&]() -> v1::CompleteRequest& {
    v1::CompleteRequest& request = prompts->emplace_back();
    if (add_special_given.has_value()) request.set_add_special_tokens(add_special);
    return request;
  };
  if (prompt->is_string()) {
    add().set_text(prompt->get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt->is_array()) {
    return WrongType("prompt", "a string, an array of strings or an array of token ids", *prompt);
  }
  if (prompt->empty()) return Invalid("prompt", "empty");
  const Json& first = prompt->front();
  if (first.is_number()) {  // one prompt of token ids
    return GetTokenIds("prompt", *prompt, add().mutable_token_ids()->mutable_ids());
  }
  if (prompt->size() > static_cast<size_t>(kMaxPromptsPerRequest)) {
    return Invalid("prompt", StrCat("more than ", kMaxPromptsPerRequest, " prompts"));
  }
  for (size_t i = 0; i < prompt->size(); ++i) {
    const Json& element = (*prompt)[i];
    const std::string field = StrCat("prompt[", i, "]");
    if (element.is_string()) {
      add().set_text(element.get<std::string>());
    } else if (element.is_array()) {
      if (element.empty()) return Invalid(field, "empty");
      LMSERVE_RETURN_IF_ERROR(
          GetTokenIds(field, element, add().mutable_token_ids()->mutable_ids()));
    } else {
      return WrongType(field, "a string or an array of token ids", element);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view body) {
  // Nesting is bounded before parsing.
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        return Invalid("body", StrCat("JSON nested deeper than ", kMaxJsonDepth, " levels"));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  Json value = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    // The parser says no more than "invalid": find where, for the message.
    try {
      [[maybe_unused]] const Json parsed = Json::parse(body);
    } catch (const Json::parse_error& error) {
      std::string what = error.what();
      if (const size_t pos = what.find("parse error"); pos != std::string::npos) {
        what = what.substr(pos);
      }
      return Invalid("body", StrCat("not valid JSON: ", what.substr(0, 300)));
    } catch (const std::exception&) {
    }
    return Invalid("body", "not valid JSON");
  }
  if (!value.is_object()) return WrongType("body", "a JSON object", value);
  return value;
}

absl::StatusOr<GenerationRequest> ParseGenerationRequest(OpenAiEndpoint endpoint,
                                                         std::string_view body) {
  LMSERVE_ASSIGN_OR_RETURN(Json object, ParseJsonObject(body));
  GenerationRequest request;
  request.endpoint = endpoint;
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(object, "model"));
  request.model = model.value_or("");
  LMSERVE_RETURN_IF_ERROR(CheckRefused(object));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> user, GetString(object, "user"));
  (void)user;  // accepted, not used
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(object, "stream"));
  request.stream = stream.value_or(false);
  if (const Json* options = Find(object, "stream_options"); options != nullptr) {
    if (!options->is_object()) return WrongType("stream_options", "an object", *options);
    if (!request.stream) return Invalid("stream_options", "only allowed with \"stream\": true");
    LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> include_usage, GetBool(*options, "include_usage"));
    request.include_usage = include_usage.value_or(false);
  }
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> return_token_ids,
                           GetBool(object, "return_token_ids"));
  request.return_token_ids = return_token_ids.value_or(false);
  LMSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> priority, GetInt(object, "priority"));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> request_id, GetString(object, "request_id"));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(object, "add_special_tokens"));

  v1::SamplingParams sampling;
  LMSERVE_RETURN_IF_ERROR(ParseSampling(object, endpoint, &request, &sampling));
  // Schemas keep their key order (the order of generated members): the body again, ordered (its
  // nesting was bounded above), when it carries one.
  std::optional<nlohmann::ordered_json> ordered;
  for (std::string_view key : {"response_format", "guided_json", "tools"}) {
    if (Find(object, key) != nullptr && !ordered.has_value()) {
      ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    }
  }
  const nlohmann::ordered_json* ordered_body = ordered.has_value() ? &*ordered : nullptr;
  LMSERVE_RETURN_IF_ERROR(ParseStructuredOutput(object, ordered_body, &request, &sampling));

  if (endpoint == OpenAiEndpoint::kCompletions) {
    for (std::string_view key : {"tools", "tool_choice"}) {
      if (Find(object, key) != nullptr) return Invalid(key, "only for chat completions");
    }
    if (Find(object, "suffix") != nullptr) {
      return Invalid("suffix", "not supported by this server");
    }
    LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(object, "echo"));
    request.echo = echo.value_or(false);
    if (request.echo && request.logprobs.has_value()) {
      // The echoed prompt's logprobs come first (the prompt's first token has none).
      sampling.set_prompt_logprobs(sampling.logprobs());
    }
    LMSERVE_RETURN_IF_ERROR(
        ParsePrompts(object, add_special.value_or(true), add_special, &request.prompts));
    for (size_t i = 0; i < request.prompts.size(); ++i) {
      v1::CompleteRequest& prompt = request.prompts[i];
      *prompt.mutable_sampling() = sampling;
      prompt.set_echo(request.echo);
      if (priority.has_value()) prompt.set_priority(static_cast<int32_t>(*priority));
      if (request_id.has_value()) {
        prompt.set_request_id(request.prompts.size() == 1 ? *request_id
                                                          : StrCat(*request_id, "-", i));
      }
    }
  } else {
    LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(object, "echo"));
    if (echo.value_or(false)) return Invalid("echo", "not supported for chat completions");
    if (add_special.value_or(false)) {
      return Invalid("add_special_tokens",
                     "not supported for chat completions: the chat template writes the special "
                     "tokens");
    }
    LMSERVE_RETURN_IF_ERROR(ParseChatFields(object, &request.chat));
    LMSERVE_RETURN_IF_ERROR(ParseTools(object, ordered_body, &request.chat));
    *request.chat.mutable_sampling() = sampling;
    if (priority.has_value()) request.chat.set_priority(static_cast<int32_t>(*priority));
    if (request_id.has_value()) request.chat.set_request_id(*request_id);
  }
  return request;
}

absl::Status ToOpenAiFieldNames(const absl::Status& status, const GenerationRequest& request,
                                int prompt_index) {
  const std::string full_message(status.message());
  const std::string_view message = full_message;
  const size_t colon = message.find(": ");
  if (status.ok() || colon == std::string_view::npos) return status;
  const std::string_view field = message.substr(0, colon);
  const std::string_view rest = message.substr(colon);
  const bool chat = request.endpoint == OpenAiEndpoint::kChatCompletions;
  std::string name;
  if (field.rfind("sampling.structured", 0) == 0 && !request.structured_field.empty()) {
    name = request.structured_field;
  } else if (field.rfind("sampling.", 0) == 0) {
    name = std::string(field.substr(9));
    if (name == "max_tokens" && request.uses_max_completion_tokens) name = "max_completion_tokens";
    if (name == "logprobs" || name == "prompt_logprobs") name = chat ? "top_logprobs" : "logprobs";
  } else if (field == "prompt" || field.rfind("prompt.", 0) == 0) {
    name = request.prompts.size() > 1 ? StrCat("prompt[", prompt_index, "]") : "prompt";
  } else {
    return status;
  }
  return absl::Status(status.code(), StrCat(name, rest));
}

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(std::string_view body) {
  LMSERVE_ASSIGN_OR_RETURN(Json object, ParseJsonObject(body));
  TokenizeRequest request;
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(object, "model"));
  request.model = model.value_or("");
  LMSERVE_ASSIGN_OR_RETURN(request.prompt, GetString(object, "prompt"));
  LMSERVE_ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(object, "add_special_tokens"));
  if (request.prompt.has_value()) {
    request.add_special_tokens = add_special.value_or(true);
    return request;
  }
  if (Find(object, "messages") == nullptr) {
    return Invalid("prompt", "missing: give \"prompt\" (text) or \"messages\"");
  }
  if (add_special.value_or(false)) {
    return Invalid("add_special_tokens", "not supported with messages");
  }
  LMSERVE_RETURN_IF_ERROR(ParseChatFields(object, &request.chat));
  return request;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(std::string_view body) {
  LMSERVE_ASSIGN_OR_RETURN(Json object, ParseJsonObject(body));
  DetokenizeRequest request;
  LMSERVE_ASSIGN_OR_RETURN(std::optional<std::string> model, GetString(object, "model"));
  request.model = model.value_or("");
  const Json* tokens = Find(object, "tokens");
  if (tokens == nullptr) return Invalid("tokens", "missing");
  google::protobuf::RepeatedField<int32_t> ids;
  LMSERVE_RETURN_IF_ERROR(GetTokenIds("tokens", *tokens, &ids));
  request.tokens.assign(ids.begin(), ids.end());
  return request;
}

// ---- Responses
// -------------------------------------------------------------------------------------

std::string DumpJson(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string SseEvent(const nlohmann::json& value) {
  return StrCat("data: ", DumpJson(value), "\n\n");
}

std::string_view OpenAiFinishReason(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kEos:
    case engine::FinishReason::kStopToken:
    case engine::FinishReason::kStopString:
    case engine::FinishReason::kConstraintEnd:
      return "stop";
    case engine::FinishReason::kMaxTokens:
    case engine::FinishReason::kContextLength:
      return "length";
    case engine::FinishReason::kAborted:
    case engine::FinishReason::kError:
      return "abort";
  }
  return "abort";
}

nlohmann::json OpenAiStopReason(engine::FinishReason reason, const std::string& stop_string,
                                std::optional<int32_t> stop_token_id) {
  if (reason == engine::FinishReason::kStopString) return stop_string;
  if (reason == engine::FinishReason::kStopToken && stop_token_id.has_value()) {
    return *stop_token_id;
  }
  return nullptr;
}

std::string LogprobTokenText(const ModelText& text, int32_t token_id) {
  std::string token = text.TokenText(token_id);
  if (token.empty() && !text.has_tokenizer()) return StrCat("token_id:", token_id);
  return token;
}

void AppendCompletionLogprobs(std::span<const engine::PositionLogprobs* const> positions,
                              const ModelText& text, int32_t top_n, int64_t* text_offset,
                              nlohmann::json* logprobs) {
  if (!logprobs->is_object() || logprobs->empty()) {
    *logprobs = {{"tokens", Json::array()},
                 {"token_logprobs", Json::array()},
                 {"top_logprobs", Json::array()},
                 {"text_offset", Json::array()}};
  }
  for (const engine::PositionLogprobs* position : positions) {
    (*logprobs)["text_offset"].push_back(*text_offset);
    if (position == nullptr) {
      (*logprobs)["tokens"].push_back(nullptr);
      (*logprobs)["token_logprobs"].push_back(nullptr);
      (*logprobs)["top_logprobs"].push_back(nullptr);
      continue;
    }
    std::string token = LogprobTokenText(text, position->token_id);
    Json top = Json::object();
    for (size_t i = 0; i < position->top.size() && static_cast<int32_t>(i) < top_n; ++i) {
      top[LogprobTokenText(text, position->top[i].token_id)] = position->top[i].logprob;
    }
    top[token] = position->logprob;  // the chosen token too, as vLLM lists it
    *text_offset += static_cast<int64_t>(token.size());
    (*logprobs)["tokens"].push_back(std::move(token));
    (*logprobs)["token_logprobs"].push_back(position->logprob);
    (*logprobs)["top_logprobs"].push_back(std::move(top));
  }
}

namespace {
Json TokenBytes(const std::string& token) {
  Json bytes = Json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}
}  // namespace

void AppendChatLogprobs(std::span<const engine::PositionLogprobs> positions, const ModelText& text,
                        int32_t top_n, nlohmann::json* logprobs) {
  if (!logprobs->is_object() || !logprobs->contains("content")) {
    *logprobs = {{"content", Json::array()}};
  }
  for (const engine::PositionLogprobs& position : positions) {
    const std::string token = LogprobTokenText(text, position.token_id);
    Json top = Json::array();
    for (size_t i = 0; i < position.top.size() && static_cast<int32_t>(i) < top_n; ++i) {
      const std::string top_token = LogprobTokenText(text, position.top[i].token_id);
      top.push_back({{"token", top_token},
                     {"logprob", position.top[i].logprob},
                     {"bytes", TokenBytes(top_token)}});
    }
    (*logprobs)["content"].push_back({{"token", token},
                                      {"logprob", position.logprob},
                                      {"bytes", TokenBytes(token)},
                                      {"top_logprobs", std::move(top)}});
  }
}

// ---- Errors
// ----------------------------------------------------------------------------------------

namespace {

// The field that starts an error message ("top_p: must be ..." -> "top_p"), or "".
std::string LeadingField(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0) return "";
  const std::string_view field = message.substr(0, colon);
  for (char c : field) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '[' || c == ']';
    if (!ok) return "";
  }
  return std::string(field);
}

}  // namespace

ApiError ToApiError(const absl::Status& status) {
  ApiError error;
  error.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      error.http_status = 400;
      error.type = "invalid_request_error";
      error.param = LeadingField(error.message);
      break;
    case absl::StatusCode::kUnauthenticated:
      error.http_status = 401;
      error.type = "invalid_request_error";
      error.code = "invalid_api_key";
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      error.type = "invalid_request_error";
      error.param = LeadingField(error.message);
      if (error.param == "model") error.code = "model_not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      error.http_status = 429;
      error.type = "rate_limit_error";
      error.code = "queue_full";
      break;
    case absl::StatusCode::kUnavailable:
      error.http_status = 503;
      error.type = "server_error";
      error.code = "service_unavailable";
      break;
    case absl::StatusCode::kCancelled:
      error.http_status = 499;
      error.type = "server_error";
      error.code = "cancelled";
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
      error.code = "internal_error";
      break;
  }
  return error;
}

ApiError HttpError(int http_status, std::string message) {
  ApiError error;
  error.http_status = http_status;
  error.message = std::move(message);
  error.type = http_status >= 500 ? "server_error" : "invalid_request_error";
  switch (http_status) {
    case 404:
      error.code = "unknown_url";
      break;
    case 405:
      error.code = "method_not_allowed";
      break;
    case 413:
      error.code = "request_too_large";
      break;
    case 431:
      error.code = "headers_too_large";
      break;
    default:
      break;
  }
  return error;
}

nlohmann::json ErrorJson(const ApiError& error) {
  auto or_null = [](const std::string& value) -> Json {
    return value.empty() ? Json(nullptr) : Json(value);
  };
  return {{"error",
           {{"message", error.message},
            {"type", error.type},
            {"param", or_null(error.param)},
            {"code", or_null(error.code)}}}};
}

}  // namespace lmserve::server
