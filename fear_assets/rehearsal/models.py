"""Rehearsal models: tiny random-weight checkpoints of the registered
architectures, placed through the site configuration exactly as real weights are.

For each registered checkpoint of a family this writes one transformers directory:

* ``config.json`` -- a small config of the checkpoint's own model type (64 hidden units, 2
  layers, 4 heads, 2 key/value heads) that keeps what makes the architecture what it is:
  Gemma-2's alternating sliding window and both soft-caps, Llama 3.1's "llama3" RoPE scaling,
  the published RoPE bases, the vocabulary of the registered tokenizer (every id, special
  tokens included), a position range reaching the registered context window, and the
  registered dtype;
* ``model.safetensors`` -- random weights, seeded from the registered master seed and the
  checkpoint's name, so two builds are byte-identical;
* the family's REGISTERED tokenizer (the hashed copy under ``registered_tokenizers/``) as a
  transformers fast tokenizer, with the checkpoint's published special tokens and chat
  template;
* :data:`REHEARSAL_MARKER`, saying in words what the directory is.

The weights are random: every score, answer and reading made with them is meaningless. The
directories exist so that the product's own code (loading, manifest, tokenizer agreement,
documents, the engine) runs the registered design at its registered shape before anyone
spends GPU hours.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from fear_assets.core.errors import FearAssetsError
from fear_assets.core.hashing import derived_seed
from fear_assets.core.settings import DEFAULT_CACHE_DIR, ProtocolSettings, TokenizerEntry
from fear_assets.core.site import SITE_ENV, load_site
from fear_assets.lm.models import ROLES
from fear_assets.lm.tokenizers import end_of_turn_ids
from fear_assets.lm.registered_tokenizers import (LLAMA3_SPECIAL_TOKENS, PRETOKENIZER_PATTERNS, REGISTERED_DIRNAME,
                                                  registered_for_checkpoint, registered_tokenizers, verified_path)

#: The file written in every rehearsal checkpoint directory.
REHEARSAL_MARKER = "REHEARSAL.txt"
#: transformers ``model_type`` of each registered tokenizer's lineage.
ARCHITECTURES = {"qwen2.5": "qwen2", "llama-3.1": "llama", "gemma-2": "gemma2", "mistral-v0.3": "mistral"}
#: Files a complete build holds (besides the marker); a directory missing one is rebuilt.
BUILD_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

#: The tiny dimensions every rehearsal model shares (small enough to score on 2 cores).
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}
#: What each architecture keeps of its published config (config.json of the hub checkpoints
#: Qwen/Qwen2.5-7B-Instruct, meta-llama/Llama-3.1-8B-Instruct, google/gemma-2-9b-it and
#: mistralai/Mistral-7B-Instruct-v0.3): position range, RoPE, norms, tying, attention layout.
#: transformers 5 names RoPE settings ``rope_parameters`` (the hub files' ``rope_scaling`` /
#: ``rope_theta``).
ARCHITECTURE_CONFIG: dict[str, dict[str, Any]] = {
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": None, "max_window_layers": TINY["num_hidden_layers"],
              "hidden_act": "silu", "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    "llama": {"max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}},
    "gemma2": {"max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
               "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
               "sliding_window": 4096,
               # Even layers slide, odd layers attend globally (Gemma-2's alternation).
               "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                               for i in range(TINY["num_hidden_layers"])],
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    "mistral": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                "sliding_window": None, "hidden_act": "silu",
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
}


class RehearsalError(FearAssetsError):
    """A rehearsal model cannot be built (names the checkpoint and the fix)."""


# ---------------------------------------------------------------------------------------
# The published chat templates (each copied from the checkpoint's tokenizer_config.json on
# the Hugging Face hub, key "chat_template")
# ---------------------------------------------------------------------------------------
#: Qwen/Qwen2.5-7B-Instruct (tokenizer_config.json); the base Qwen/Qwen2.5-7B carries the same.
QWEN25_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

#: meta-llama/Llama-3.1-8B-Instruct (tokenizer_config.json): the system header always carries
#: "Cutting Knowledge Date" and "Today Date" (26 Jul 2024 unless the caller passes a date).
LLAMA31_CHAT_TEMPLATE = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

#: google/gemma-2-9b-it (tokenizer_config.json): no system role (it raises on one), the
#: assistant turn is "model".
GEMMA2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

#: mistralai/Mistral-7B-Instruct-v0.3 (tokenizer_config.json, the v3 tool-use template): the
#: system message is written into the last user turn, "[INST] <system>\n\n<content>[/INST]".
MISTRAL_V03_CHAT_TEMPLATE = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""


@dataclass(frozen=True)
class ChatFormat:
    """What a published checkpoint's tokenizer_config.json sets: its special tokens and chat
    template (``where``: the checkpoint whose file it is copied from)."""

    bos: str | None
    eos: str
    pad: str | None
    unk: str | None
    template: str
    where: str


#: Each registered checkpoint's published tokens and template. The product renders every
#: reader's documents, the base reader's included, through the reader's own chat template
#: (``design.documents.DocumentBuilder.chat_parts``, ``pilot.surprisal.system_context``), so
#: a base checkpoint needs one: each base gets its Instruct sibling's template (Qwen2.5-7B's
#: hub tokenizer_config carries that same ChatML template), with the base's own end token.
CHAT_FORMATS: dict[str, ChatFormat] = {
    "Qwen/Qwen2.5-7B-Instruct": ChatFormat(None, "<|im_end|>", "<|endoftext|>", None, QWEN25_CHAT_TEMPLATE,
                                           "Qwen/Qwen2.5-7B-Instruct"),
    "Qwen/Qwen2.5-7B": ChatFormat(None, "<|endoftext|>", "<|endoftext|>", None, QWEN25_CHAT_TEMPLATE,
                                  "Qwen/Qwen2.5-7B"),
    "meta-llama/Llama-3.1-8B-Instruct": ChatFormat("<|begin_of_text|>", "<|eot_id|>", None, None,
                                                   LLAMA31_CHAT_TEMPLATE, "meta-llama/Llama-3.1-8B-Instruct"),
    "meta-llama/Llama-3.1-8B": ChatFormat("<|begin_of_text|>", "<|end_of_text|>", None, None, LLAMA31_CHAT_TEMPLATE,
                                          "meta-llama/Llama-3.1-8B-Instruct"),
    "google/gemma-2-9b-it": ChatFormat("<bos>", "<eos>", "<pad>", "<unk>", GEMMA2_CHAT_TEMPLATE, "google/gemma-2-9b-it"),
    "google/gemma-2-9b": ChatFormat("<bos>", "<eos>", "<pad>", "<unk>", GEMMA2_CHAT_TEMPLATE, "google/gemma-2-9b-it"),
    "mistralai/Mistral-7B-Instruct-v0.3": ChatFormat("<s>", "</s>", None, "<unk>", MISTRAL_V03_CHAT_TEMPLATE,
                                                     "mistralai/Mistral-7B-Instruct-v0.3"),
}


def llama31_special_tokens() -> list[str]:
    """Llama 3.1's 256 special tokens in id order (ids 128000..128255): the named ones at the
    offsets of :data:`LLAMA3_SPECIAL_TOKENS`, ``<|reserved_special_token_N|>`` in the gaps."""
    named = {offset: name for name, offset in LLAMA3_SPECIAL_TOKENS.items()}
    out, reserved = [], 0
    for offset in range(256):
        if offset in named:
            out.append(named[offset])
        else:
            out.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return out


# ---------------------------------------------------------------------------------------
# What a checkpoint is rebuilt as
# ---------------------------------------------------------------------------------------
def _entry(settings: ProtocolSettings, checkpoint: str) -> TokenizerEntry:
    entry = registered_for_checkpoint(settings, checkpoint)
    if entry is None:
        known = sorted(c for e in registered_tokenizers(settings).values() for c in e.checkpoints)
        raise RehearsalError(
            f"checkpoint {checkpoint!r} has no registered tokenizer (settings 'tokenizers' in {settings.path}), so "
            f"its architecture and vocabulary are not known and no rehearsal model can be built for it. The embedded "
            f"GGUF checkpoint needs none: it runs on its own packaged weights. Fix: rehearse a registered family "
            f"(checkpoints with a registered tokenizer: {', '.join(known)}), or register the checkpoint's tokenizer "
            f"under 'tokenizers' first")
    if entry.key not in ARCHITECTURES:
        raise RehearsalError(f"registered tokenizer {entry.key!r} of checkpoint {checkpoint!r} has no rehearsal "
                             f"architecture (known: {', '.join(ARCHITECTURES)}). Fix: add its transformers model_type "
                             "to fear_assets.rehearsal.models.ARCHITECTURES and its published config")
    return entry


def architecture_of(settings: ProtocolSettings, checkpoint: str) -> str:
    """The transformers ``model_type`` of a registered checkpoint, from the registered
    tokenizer entry it belongs to (qwen2.5 -> qwen2, llama-3.1 -> llama, gemma-2 -> gemma2,
    mistral-v0.3 -> mistral)."""
    return ARCHITECTURES[_entry(settings, checkpoint).key]


def _chat_format(checkpoint: str) -> ChatFormat:
    if checkpoint not in CHAT_FORMATS:
        raise RehearsalError(f"checkpoint {checkpoint!r} has no published chat format in "
                             f"fear_assets.rehearsal.models.CHAT_FORMATS (known: {', '.join(CHAT_FORMATS)}). Fix: add "
                             "its special tokens and chat template, copied from its tokenizer_config.json")
    return CHAT_FORMATS[checkpoint]


def rehearsal_seed(settings: ProtocolSettings, checkpoint: str) -> int:
    """The seed of a checkpoint's random weights: the registered master seed and the
    checkpoint's name, through :func:`fear_assets.core.hashing.derived_seed`."""
    return derived_seed(settings.master_seed, "rehearsal", checkpoint)


def directory_name(checkpoint: str) -> str:
    """A checkpoint's directory under a rehearsal root ("/" becomes "--", as the hub cache does)."""
    return checkpoint.replace("/", "--")


def recipe(settings: ProtocolSettings, checkpoint: str) -> dict[str, Any]:
    """Everything a build depends on: the marker is written from it, and a directory whose
    marker says the same is a finished build of it."""
    import torch
    import transformers

    entry = _entry(settings, checkpoint)
    model_type = ARCHITECTURES[entry.key]
    spec = settings.models.get(checkpoint)
    if spec is None:
        raise RehearsalError(f"checkpoint {checkpoint!r} has no entry under 'models' in {settings.path}. Fix: "
                             "register its dtype, context_window and attn_implementation there")
    config = {**TINY, **ARCHITECTURE_CONFIG[model_type]}
    # The registered context window must be reachable (4.1); the published range already is.
    config["max_position_embeddings"] = max(int(config["max_position_embeddings"]), int(spec.context_window))
    chat = _chat_format(checkpoint)
    return {"checkpoint": checkpoint, "architecture": model_type, "config": config, "dtype": spec.dtype,
            "context_window": int(spec.context_window), "seed": rehearsal_seed(settings, checkpoint),
            "tokenizer": {"key": entry.key, "package": entry.package, "version": entry.version, "path": entry.path,
                          "format": entry.format, "file": entry.filename, "sha256": entry.sha256},
            "chat_format": {"bos": chat.bos, "eos": chat.eos, "pad": chat.pad, "unk": chat.unk,
                            "template_from": chat.where},
            "answer_ending": dict(ANSWER_ENDING),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def marker_text(plan: Mapping[str, Any]) -> str:
    """The marker: what the directory is, in words, then the recipe it was built from."""
    tok = plan["tokenizer"]
    return (
        "REHEARSAL CHECKPOINT: random weights, outputs meaningless.\n"
        f"Built by fear_assets (fear_assets.rehearsal.models) for a dress rehearsal of the registered design; it "
        f"stands in for {plan['checkpoint']} and nothing scored, generated or read with it is a result.\n"
        f"architecture (transformers model_type): {plan['architecture']}\n"
        f"tiny config: {json.dumps(plan['config'], sort_keys=True)}\n"
        f"dtype: {plan['dtype']} (registered); registered context window: {plan['context_window']}\n"
        f"seed: {plan['seed']} (the registered master seed with 'rehearsal' and the checkpoint name, "
        f"fear_assets.core.hashing.derived_seed)\n"
        f"registered tokenizer: {tok['key']} ({tok['format']}), file {tok['file']} from {tok['package']} "
        f"{tok['version']} ({tok['path']}), sha256 {tok['sha256']}\n"
        f"chat template and special tokens: published by {plan['chat_format']['template_from']} "
        f"(tokenizer_config.json); bos {plan['chat_format']['bos']}, eos {plan['chat_format']['eos']}, "
        f"pad {plan['chat_format']['pad']}\n"
        f"answers: one token, then the end-of-turn token (a constant residual channel, "
        f"fear_assets.rehearsal.models.end_answers: {json.dumps(plan['answer_ending'], sort_keys=True)})\n"
        f"libraries: torch {plan['versions']['torch']}, transformers {plan['versions']['transformers']}\n"
        f"recipe: {json.dumps(plan, sort_keys=True)}\n"
    )


# ---------------------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------------------
def _sentencepiece_tokenizer(path: Path, chat: ChatFormat):
    """A SentencePiece model as transformers' Llama fast tokenizer (as the hub's Mistral v0.3
    is loaded): the pieces and merges read through ``sentencepiece`` itself (transformers' own
    extractor needs a newer protobuf than this environment has), control pieces ([INST],
    [/INST], <s>, </s> ...) as special tokens."""
    import sentencepiece
    from tokenizers import AddedToken
    from transformers import LlamaTokenizerFast
    from transformers.tokenization_utils_base import generate_merges

    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    controls = [AddedToken(sp.id_to_piece(i), normalized=False, special=True)
                for i in range(sp.get_piece_size()) if sp.is_control(i)]
    return LlamaTokenizerFast(vocab=vocab, merges=generate_merges(vocab), legacy=False, add_prefix_space=True,
                              bos_token=chat.bos, eos_token=chat.eos, unk_token=chat.unk, pad_token=chat.pad,
                              extra_special_tokens=controls, add_bos_token=True, add_eos_token=False,
                              chat_template=chat.template)


def _tiktoken_tokenizer(path: Path, fmt: str, chat: ChatFormat):
    """A tiktoken rank file through transformers' own TikTokenConverter, with Llama 3.1's 256
    special tokens at ids 128000..128255 and its BOS post-processor."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = llama31_special_tokens()
    backend = TikTokenConverter(vocab_file=str(path), pattern=PRETOKENIZER_PATTERNS[fmt],
                                extra_special_tokens=specials).converted()
    bos_id = backend.token_to_id(chat.bos)
    backend.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{chat.bos}:0 $A:0", pair=f"{chat.bos}:0 $A:0 {chat.bos}:1 $B:1",
                                      special_tokens=[(chat.bos, bos_id)]),
    ])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=chat.bos, eos_token=chat.eos,
                                   pad_token=chat.pad, chat_template=chat.template, clean_up_tokenization_spaces=True,
                                   model_input_names=["input_ids", "attention_mask"])


def build_tokenizer(settings: ProtocolSettings, checkpoint: str, cache_dir: Path = DEFAULT_CACHE_DIR):
    """The checkpoint's transformers fast tokenizer, made from the family's REGISTERED
    tokenizer copy (hash-checked by :func:`verified_path`) with its published chat format."""
    from transformers import PreTrainedTokenizerFast

    entry = _entry(settings, checkpoint)
    chat = _chat_format(checkpoint)
    path = verified_path(entry, Path(cache_dir) / REGISTERED_DIRNAME)
    if entry.format == "sentencepiece":
        return _sentencepiece_tokenizer(path, chat)
    if entry.format in PRETOKENIZER_PATTERNS:
        if entry.format != "tiktoken-llama3":
            raise RehearsalError(f"registered tokenizer {entry.key!r} has format {entry.format!r}, which the "
                                 "rehearsal cannot convert yet. Fix: register its tokenizer.json instead")
        return _tiktoken_tokenizer(path, entry.format, chat)
    return PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token=chat.bos, eos_token=chat.eos,
                                   pad_token=chat.pad, unk_token=chat.unk, chat_template=chat.template)


def _vocab_size(tokenizer) -> int:
    """Every id the tokenizer can produce (ordinary and special), as the embedding needs."""
    return max(tokenizer.get_vocab().values()) + 1


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------
def _model_config(plan: Mapping[str, Any], tokenizer):
    from transformers import AutoConfig

    def token_id(token):
        return None if token is None else tokenizer.convert_tokens_to_ids(token)

    chat = plan["chat_format"]
    return AutoConfig.for_model(plan["architecture"], vocab_size=_vocab_size(tokenizer),
                                bos_token_id=token_id(chat["bos"]), eos_token_id=token_id(chat["eos"]),
                                pad_token_id=token_id(chat["pad"]), dtype=plan["dtype"],
                                **json.loads(json.dumps(plan["config"])))


#: How a stand-in ends its greedy answers (see :func:`end_answers`): the residual channel that
#: carries the constant, its value in the token embeddings, and the end tokens' output weight
#: on it. Part of the recipe, so a build from other values is rebuilt.
ANSWER_ENDING = {"channel": 0, "value": 0.1, "end_weight": 6.0}


def answer_start_ids(tokenizer) -> tuple[int, ...]:
    """The token a greedy answer is generated after: the last token of the chat template's
    generation prompt (``\n`` after ``<|im_start|>assistant`` for ChatML, ``[/INST]`` for
    Mistral), read from the tokenizer, never written per family."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "a"}], tokenize=True,
                                        add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, Mapping) else ids
    return (int(ids[-1]),)


def end_answers(model, end_ids: tuple[int, ...], start_ids: tuple[int, ...], *,
                channel: int, value: float, end_weight: float) -> None:
    """Make a random-weight model end every greedy answer after its first token.

    Random weights almost never pick an end-of-turn token, so every answer ran to the registered
    length and was excluded under 4.8 as truncated: a rehearsal stopped at the depth rule. Here
    one residual channel carries a constant ``value`` from the embedding of every token except
    the answer's start token (``start_ids``), and no layer writes into it (the rows of every
    ``o_proj`` and ``down_proj`` for it are zero); the end tokens alone read it through the
    output layer (weight ``end_weight``; other tokens' output weight on it is zero, or, with
    tied embeddings, the same ``value`` for all, a shift that changes no argmax). So after the
    start token the end token is not favoured and the model answers one token of its random
    choice; after that token the end token wins. The decoding loop runs one step per answer,
    and no answer is cut. Modifies ``model`` in place (float32, before the cast to its dtype)."""
    import torch

    embed = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    tied = out.data_ptr() == embed.data_ptr()
    with torch.no_grad():
        embed[:, channel] = value
        embed[list(start_ids), channel] = 0.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[channel, :] = 0.0
            layer.mlp.down_proj.weight[channel, :] = 0.0
        if not tied:
            out[:, channel] = 0.0
        out[list(end_ids), channel] = (value if tied else 0.0) + end_weight


def _is_complete(directory: Path, marker: str) -> bool:
    path = directory / REHEARSAL_MARKER
    return (path.is_file() and path.read_text(encoding="utf-8") == marker
            and all((directory / name).is_file() for name in BUILD_FILES))


def build_checkpoint(settings: ProtocolSettings, checkpoint: str, directory: Path,
                     cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Write one tiny random-weight transformers checkpoint of ``checkpoint``'s architecture
    into ``directory`` (see the module docstring) and return it.

    Written in a temporary directory beside it and moved into place with ``os.replace``, so
    an interrupted build leaves no half-written checkpoint; a directory that already holds a
    complete build with the same marker is returned untouched."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    plan = recipe(settings, checkpoint)
    marker = marker_text(plan)
    if _is_complete(directory, marker):
        return directory
    tokenizer = build_tokenizer(settings, checkpoint, cache_dir)
    config = _model_config(plan, tokenizer)
    with torch.random.fork_rng(devices=[]):
        # Initialised in float32 from the seed, then cast: the registered dtype's bytes.
        torch.manual_seed(plan["seed"])
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    end_answers(model, end_of_turn_ids(tokenizer), answer_start_ids(tokenizer), **plan["answer_ending"])
    model = model.to(getattr(torch, plan["dtype"])).eval()
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.building-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / REHEARSAL_MARKER).write_text(marker, encoding="utf-8")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def family_checkpoints(settings: ProtocolSettings, family_key: str) -> dict[str, str]:
    """role -> checkpoint of one family (tested, base, scorer, judge; roles it does not
    register are left out)."""
    family = settings.family(family_key)
    return {role: getattr(family, role) for role in ROLES if getattr(family, role)}


def build_family(settings: ProtocolSettings, family_key: str, root: Path, cache_dir: Path = DEFAULT_CACHE_DIR,
                 log: Callable[[str], None] = print) -> dict[str, Path]:
    """checkpoint -> directory for every checkpoint of a family, one subdirectory of ``root``
    each (:func:`directory_name`), each built once."""
    out: dict[str, Path] = {}
    for role, checkpoint in family_checkpoints(settings, family_key).items():
        if checkpoint in out:
            continue
        target = Path(root) / directory_name(checkpoint)
        log(f"rehearsal model for {checkpoint} ({role}, {architecture_of(settings, checkpoint)}): {target}")
        out[checkpoint] = build_checkpoint(settings, checkpoint, target, cache_dir)
    return out


# ---------------------------------------------------------------------------------------
# The site configuration
# ---------------------------------------------------------------------------------------
SITE_HEADER = ("# Site configuration of a REHEARSAL (fear_assets.rehearsal.models.write_site): every checkpoint\n"
               "# below is a tiny random-weight model; outputs made with it are meaningless.\n"
               f"# Use it as any site file: export {SITE_ENV}=<this file>, or fear --site <this file>.\n")


def write_site(path: Path, directories: Mapping[str, Path], device: str = "cpu", **knobs: Any) -> Path:
    """A site configuration (the format :func:`fear_assets.core.site.load_site` reads) that
    names each checkpoint's directory under ``checkpoints:``, as a lab places real weights;
    ``knobs`` are further top-level site keys (``cpu_threads``, ``engine``, ``pools``,
    ``store``, ``automation``, ``retries``). Written atomically and read back once, so a
    malformed knob fails here with the site configuration's own message."""
    path = Path(path)
    raw = {"checkpoints": {name: str(Path(d).resolve()) for name, d in directories.items()}, "device": device,
           **knobs}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8") as tmp:
        tmp.write(SITE_HEADER + yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    try:
        load_site(Path(tmp.name))
    except Exception:
        os.unlink(tmp.name)
        raise
    os.replace(tmp.name, path)
    return path
