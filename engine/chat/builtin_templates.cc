// The built-in chat templates: the texts these models publish in tokenizer_config.json, byte for
// byte (tests/engine/chat/testdata/templates/ holds the same texts; a test checks they agree).

#include <algorithm>

#include "engine/chat/chat_template.h"

namespace lmserve::engine {
namespace {

struct BuiltinTemplate {
  std::string_view name;
  std::string_view source;
};

// clang-format off
constexpr BuiltinTemplate kBuiltinTemplates[] = {
    // ChatML as teknium/OpenHermes-2.5-Mistral-7B publishes it (no default system prompt)
    {"chatml", R"jinja({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})jinja"},
    // meta-llama/Llama-2-7b-chat-hf
    {"llama2", R"jinja({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})jinja"},
    // meta-llama/Meta-Llama-3-8B-Instruct
    {"llama3", R"jinja({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})jinja"},
    // mistralai/Mistral-7B-Instruct-v0.2
    {"mistral", R"jinja({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})jinja"},
    // HuggingFaceH4/zephyr-7b-beta
    {"zephyr", R"jinja({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})jinja"},
};
// clang-format on

}  // namespace

std::optional<std::string_view> BuiltinChatTemplate(std::string_view name) {
  for (const BuiltinTemplate& builtin : kBuiltinTemplates) {
    if (builtin.name == name) return builtin.source;
  }
  return std::nullopt;
}

std::vector<std::string_view> BuiltinChatTemplateNames() {
  std::vector<std::string_view> names;
  for (const BuiltinTemplate& builtin : kBuiltinTemplates) names.push_back(builtin.name);
  return names;
}

}  // namespace lmserve::engine
