-- vllm-perimeter Lua module for NGINX's lua module (generator option lua_module; generated with
-- the NGINX config; do not edit). Loaded once (init_by_lua_block), its LuaJIT VM kept across
-- requests. The rule program's interpreter, JSON reader and sha256 are Envoy's (one interpreter
-- for two proxies); this adapter stands in for Envoy's handle:
--   set_by_lua      key_hash (the bearer key's sha256, cached per bearer in the worker, bounded)
--   content_by_lua  body, on the routes scanner/generate/nginx_model.py lua_refusal gives Lua (njs's
--                   perimeter.direct elsewhere): the program, then the admitted body on to the
--                   route's <up>_checked (rewritten: <up>_rewrite), or the refusal's named location
local M = {}
local byte, find, sub, char, lower, match, gsub = string.byte, string.find, string.sub, string.char,
    string.lower, string.match, string.gsub
local concat, tonumber, tostring = table.concat, tonumber, tostring
-- JSON null in a rule program and in a decoded value (a pin to null writes null)
local NULL = {}
-- The rule programs (scanner/plan/program.py, as perimeter-rules.json) by id, as Lua runs them,
-- and each body check's ($perimeter_check) program.
local PROGRAMS = {
  ["r1"] = {{["op"] = "keys", ["unknown"] = "pass", ["modes"] = {["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject"}}},
  ["r2"] = {{["op"] = "cap", ["path"] = "best_of", ["max"] = 8}, {["op"] = "cap", ["path"] = "max_completion_tokens", ["max"] = 8192}, {["op"] = "cap", ["path"] = "max_tokens", ["max"] = 8192}, {["op"] = "cap", ["path"] = "n", ["max"] = 8}, {["op"] = "keys", ["unknown"] = "pass", ["modes"] = {["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject"}}, {["op"] = "envelope", ["items"] = {{"prompt", "prompts"}, {"input", "prompts"}, {"messages", "prompts"}, {"texts", "each"}, {"images", "each"}, {"inputs", "each"}}, ["pairs"] = {{"query", "documents"}, {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}}, ["per"] = {"n", "best_of"}, ["out"] = {}, ["rest"] = 0, ["max_sequences"] = 256, ["max_tokens"] = 6291456}},
  ["r3"] = {{["op"] = "cap", ["path"] = "best_of", ["max"] = 4}, {["op"] = "cap", ["path"] = "logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "max_completion_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_output_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "n", ["max"] = 4}, {["op"] = "cap", ["path"] = "prompt_logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "top_logprobs", ["max"] = 20}, {["op"] = "keys", ["unknown"] = "reject", ["modes"] = {["add_generation_prompt"] = "allow", ["add_special_tokens"] = "allow", ["allowed_token_ids"] = "allow", ["background"] = "allow", ["bad_words"] = "allow", ["best_of"] = "allow", ["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject", ["continue_final_message"] = "allow", ["data_1"] = "allow", ["data_2"] = "allow", ["dimensions"] = "allow", ["documents"] = "allow", ["ec_transfer_params"] = "reject", ["echo"] = "allow", ["embed_dtype"] = "allow", ["embedding_types"] = "allow", ["enable_response_messages"] = "allow", ["encoding_format"] = "allow", ["endianness"] = "allow", ["file"] = "allow", ["frequency_penalty"] = "allow", ["hotwords"] = "allow", ["ignore_eos"] = "reject", ["images"] = "allow", ["include"] = "allow", ["include_reasoning"] = "allow", ["include_stop_str_in_output"] = "allow", ["input"] = "allow", ["input_type"] = "allow", ["inputs"] = "allow", ["instruction"] = "allow", ["instructions"] = "allow", ["items"] = "allow", ["kv_transfer_params"] = "reject", ["language"] = "allow", ["length_penalty"] = "allow", ["logit_bias"] = "allow", ["logprob_token_ids"] = "allow", ["logprobs"] = "allow", ["max_completion_tokens"] = "allow", ["max_output_tokens"] = "allow", ["max_tokens"] = "allow", ["max_tokens_per_doc"] = "allow", ["max_tokens_per_query"] = "allow", ["max_tool_calls"] = "allow", ["media_io_kwargs"] = "reject", ["messages"] = "allow", ["metadata"] = "allow", ["min_p"] = "allow", ["min_tokens"] = "allow", ["mm_payload"] = "reject", ["mm_processor_kwargs"] = "reject", ["model"] = "allow", ["n"] = "allow", ["output_config"] = "allow", ["output_dimension"] = "allow", ["padding"] = "allow", ["parallel_tool_calls"] = "allow", ["presence_penalty"] = "allow", ["previous_input_messages"] = "allow", ["previous_response_id"] = "allow", ["priority"] = "reject", ["prompt"] = "allow", ["prompt_cache_key"] = "reject", ["prompt_cache_options"] = "reject", ["prompt_cache_retention"] = "reject", ["prompt_embeds"] = "reject", ["prompt_logprobs"] = "allow", ["queries"] = "allow", ["query"] = "allow", ["reasoning"] = "allow", ["reasoning_effort"] = "allow", ["repetition_detection"] = "allow", ["repetition_penalty"] = "allow", ["request_id"] = "reject", ["response_format"] = "allow", ["return_assistant_tokens_mask"] = "allow", ["return_mm_kwargs"] = "reject", ["return_prompt_text"] = "allow", ["return_token_ids"] = "allow", ["return_token_offsets"] = "allow", ["return_tokens_as_token_ids"] = "allow", ["return_weight_versions"] = "allow", ["routed_experts_prompt_start"] = "reject", ["safety_identifier"] = "allow", ["seed"] = "allow", ["service_tier"] = "allow", ["session_id"] = "reject", ["skip_special_tokens"] = "allow", ["spaces_between_special_tokens"] = "allow", ["stop"] = "allow", ["stop_sequences"] = "allow", ["stop_token_ids"] = "allow", ["store"] = "allow", ["stream"] = "allow", ["stream_continuous_usage_stats"] = "allow", ["stream_include_usage"] = "allow", ["stream_interval"] = "reject", ["stream_options"] = "allow", ["structured_outputs"] = "reject", ["suffix"] = "allow", ["system"] = "allow", ["temperature"] = "allow", ["text"] = "allow", ["text_1"] = "allow", ["text_2"] = "allow", ["texts"] = "allow", ["thinking"] = "allow", ["thinking_token_budget"] = "allow", ["to_language"] = "allow", ["tool_choice"] = "allow", ["tools"] = "allow", ["top_k"] = "allow", ["top_logprobs"] = "allow", ["top_n"] = "allow", ["top_p"] = "allow", ["truncate"] = "allow", ["truncate_prompt_tokens"] = "allow", ["truncation"] = "allow", ["truncation_side"] = "allow", ["use_activation"] = "allow", ["use_beam_search"] = "allow", ["user"] = "allow", ["vllm_xargs"] = "reject", ["watermarking"] = "allow"}}, {["op"] = "count", ["field"] = "bad_words", ["max"] = 64}, {["op"] = "count", ["field"] = "logit_bias", ["max"] = 300}, {["op"] = "count", ["field"] = "messages", ["max"] = 1024}, {["op"] = "count", ["field"] = "stop", ["max"] = 16}, {["op"] = "count", ["field"] = "stop_token_ids", ["max"] = 64}, {["op"] = "count", ["field"] = "tools", ["max"] = 128}, {["op"] = "media", ["hosts"] = {}, ["urls"] = "deny", ["domains"] = {}, ["data"] = 524288, ["items"] = 8, ["embeds"] = "deny"}, {["op"] = "envelope", ["items"] = {{"prompt", "prompts"}, {"input", "prompts"}, {"messages", "prompts"}, {"texts", "each"}, {"images", "each"}, {"inputs", "each"}}, ["pairs"] = {{"query", "documents"}, {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}}, ["per"] = {"n", "best_of"}, ["out"] = {}, ["rest"] = 0, ["max_sequences"] = 16, ["max_tokens"] = 1114112}},
  ["r4"] = {{["op"] = "cap", ["path"] = "best_of", ["max"] = 4}, {["op"] = "cap", ["path"] = "logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "max_completion_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_output_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "n", ["max"] = 4}, {["op"] = "cap", ["path"] = "prompt_logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "top_logprobs", ["max"] = 20}, {["op"] = "keys", ["unknown"] = "reject", ["modes"] = {["add_generation_prompt"] = "allow", ["add_special_tokens"] = "allow", ["allowed_token_ids"] = "allow", ["background"] = "allow", ["bad_words"] = "allow", ["best_of"] = "allow", ["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject", ["continue_final_message"] = "allow", ["data_1"] = "allow", ["data_2"] = "allow", ["dimensions"] = "allow", ["documents"] = "allow", ["ec_transfer_params"] = "reject", ["echo"] = "allow", ["embed_dtype"] = "allow", ["embedding_types"] = "allow", ["enable_response_messages"] = "allow", ["encoding_format"] = "allow", ["endianness"] = "allow", ["file"] = "allow", ["frequency_penalty"] = "allow", ["hotwords"] = "allow", ["ignore_eos"] = "reject", ["images"] = "allow", ["include"] = "allow", ["include_reasoning"] = "allow", ["include_stop_str_in_output"] = "allow", ["input"] = "allow", ["input_type"] = "allow", ["inputs"] = "allow", ["instruction"] = "allow", ["instructions"] = "allow", ["items"] = "allow", ["kv_transfer_params"] = "reject", ["language"] = "allow", ["length_penalty"] = "allow", ["logit_bias"] = "allow", ["logprob_token_ids"] = "allow", ["logprobs"] = "allow", ["max_completion_tokens"] = "allow", ["max_output_tokens"] = "allow", ["max_tokens"] = "allow", ["max_tokens_per_doc"] = "allow", ["max_tokens_per_query"] = "allow", ["max_tool_calls"] = "allow", ["media_io_kwargs"] = "reject", ["messages"] = "allow", ["metadata"] = "allow", ["min_p"] = "allow", ["min_tokens"] = "allow", ["mm_payload"] = "reject", ["mm_processor_kwargs"] = "reject", ["model"] = "allow", ["n"] = "allow", ["output_config"] = "allow", ["output_dimension"] = "allow", ["padding"] = "allow", ["parallel_tool_calls"] = "allow", ["presence_penalty"] = "allow", ["previous_input_messages"] = "allow", ["previous_response_id"] = "allow", ["priority"] = "reject", ["prompt"] = "allow", ["prompt_cache_key"] = "reject", ["prompt_cache_options"] = "reject", ["prompt_cache_retention"] = "reject", ["prompt_embeds"] = "reject", ["prompt_logprobs"] = "allow", ["queries"] = "allow", ["query"] = "allow", ["reasoning"] = "allow", ["reasoning_effort"] = "allow", ["repetition_detection"] = "allow", ["repetition_penalty"] = "allow", ["request_id"] = "reject", ["response_format"] = "allow", ["return_assistant_tokens_mask"] = "allow", ["return_mm_kwargs"] = "reject", ["return_prompt_text"] = "allow", ["return_token_ids"] = "allow", ["return_token_offsets"] = "allow", ["return_tokens_as_token_ids"] = "allow", ["return_weight_versions"] = "allow", ["routed_experts_prompt_start"] = "reject", ["safety_identifier"] = "allow", ["seed"] = "allow", ["service_tier"] = "allow", ["session_id"] = "reject", ["skip_special_tokens"] = "allow", ["spaces_between_special_tokens"] = "allow", ["stop"] = "allow", ["stop_sequences"] = "allow", ["stop_token_ids"] = "allow", ["store"] = "allow", ["stream"] = "allow", ["stream_continuous_usage_stats"] = "allow", ["stream_include_usage"] = "allow", ["stream_interval"] = "reject", ["stream_options"] = "allow", ["structured_outputs"] = "reject", ["suffix"] = "allow", ["system"] = "allow", ["temperature"] = "allow", ["text"] = "allow", ["text_1"] = "allow", ["text_2"] = "allow", ["texts"] = "allow", ["thinking"] = "allow", ["thinking_token_budget"] = "allow", ["to_language"] = "allow", ["tool_choice"] = "allow", ["tools"] = "allow", ["top_k"] = "allow", ["top_logprobs"] = "allow", ["top_n"] = "allow", ["top_p"] = "allow", ["truncate"] = "allow", ["truncate_prompt_tokens"] = "allow", ["truncation"] = "allow", ["truncation_side"] = "allow", ["use_activation"] = "allow", ["use_beam_search"] = "allow", ["user"] = "allow", ["vllm_xargs"] = "reject", ["watermarking"] = "allow"}}, {["op"] = "count", ["field"] = "bad_words", ["max"] = 64}, {["op"] = "count", ["field"] = "logit_bias", ["max"] = 300}, {["op"] = "count", ["field"] = "messages", ["max"] = 1024}, {["op"] = "count", ["field"] = "stop", ["max"] = 16}, {["op"] = "count", ["field"] = "stop_token_ids", ["max"] = 64}, {["op"] = "count", ["field"] = "tools", ["max"] = 128}, {["op"] = "media", ["hosts"] = {}, ["urls"] = "deny", ["domains"] = {}, ["data"] = 524288, ["items"] = 8, ["embeds"] = "deny"}, {["op"] = "budget", ["names"] = {"max_completion_tokens"}, ["level"] = {"max_completion_tokens", "max_tokens"}, ["fields"] = {"max_completion_tokens", "max_tokens"}, ["field"] = "max_completion_tokens", ["absent"] = "inject", ["cap"] = 4096, ["window"] = 0}, {["op"] = "envelope", ["items"] = {{"prompt", "prompts"}, {"input", "prompts"}, {"messages", "prompts"}, {"texts", "each"}, {"images", "each"}, {"inputs", "each"}}, ["pairs"] = {{"query", "documents"}, {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}}, ["per"] = {"n", "best_of"}, ["out"] = {"max_completion_tokens", "max_tokens"}, ["rest"] = 4096, ["max_sequences"] = 16, ["max_tokens"] = 1114112}},
  ["r5"] = {{["op"] = "cap", ["path"] = "best_of", ["max"] = 8}, {["op"] = "cap", ["path"] = "max_completion_tokens", ["max"] = 8192}, {["op"] = "cap", ["path"] = "max_tokens", ["max"] = 8192}, {["op"] = "cap", ["path"] = "n", ["max"] = 8}, {["op"] = "keys", ["unknown"] = "pass", ["modes"] = {["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject"}}, {["op"] = "budget", ["names"] = {"max_completion_tokens"}, ["level"] = {"max_completion_tokens", "max_tokens"}, ["fields"] = {"max_completion_tokens", "max_tokens"}, ["field"] = "max_completion_tokens", ["absent"] = "inject", ["cap"] = 8192, ["window"] = 0}, {["op"] = "envelope", ["items"] = {{"prompt", "prompts"}, {"input", "prompts"}, {"messages", "prompts"}, {"texts", "each"}, {"images", "each"}, {"inputs", "each"}}, ["pairs"] = {{"query", "documents"}, {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}}, ["per"] = {"n", "best_of"}, ["out"] = {"max_completion_tokens", "max_tokens"}, ["rest"] = 8192, ["max_sequences"] = 256, ["max_tokens"] = 6291456}},
  ["r6"] = {{["op"] = "cap", ["path"] = "best_of", ["max"] = 4}, {["op"] = "cap", ["path"] = "logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "max_completion_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_output_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "n", ["max"] = 4}, {["op"] = "cap", ["path"] = "prompt_logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "top_logprobs", ["max"] = 20}, {["op"] = "keys", ["unknown"] = "reject", ["modes"] = {["add_generation_prompt"] = "allow", ["add_special_tokens"] = "allow", ["allowed_token_ids"] = "allow", ["background"] = "allow", ["bad_words"] = "allow", ["best_of"] = "allow", ["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject", ["continue_final_message"] = "allow", ["data_1"] = "allow", ["data_2"] = "allow", ["dimensions"] = "allow", ["documents"] = "allow", ["ec_transfer_params"] = "reject", ["echo"] = "allow", ["embed_dtype"] = "allow", ["embedding_types"] = "allow", ["enable_response_messages"] = "allow", ["encoding_format"] = "allow", ["endianness"] = "allow", ["file"] = "allow", ["frequency_penalty"] = "allow", ["hotwords"] = "allow", ["ignore_eos"] = "reject", ["images"] = "allow", ["include"] = "allow", ["include_reasoning"] = "allow", ["include_stop_str_in_output"] = "allow", ["input"] = "allow", ["input_type"] = "allow", ["inputs"] = "allow", ["instruction"] = "allow", ["instructions"] = "allow", ["items"] = "allow", ["kv_transfer_params"] = "reject", ["language"] = "allow", ["length_penalty"] = "allow", ["logit_bias"] = "allow", ["logprob_token_ids"] = "allow", ["logprobs"] = "allow", ["max_completion_tokens"] = "allow", ["max_output_tokens"] = "allow", ["max_tokens"] = "allow", ["max_tokens_per_doc"] = "allow", ["max_tokens_per_query"] = "allow", ["max_tool_calls"] = "allow", ["media_io_kwargs"] = "reject", ["messages"] = "allow", ["metadata"] = "allow", ["min_p"] = "allow", ["min_tokens"] = "allow", ["mm_payload"] = "reject", ["mm_processor_kwargs"] = "reject", ["model"] = "allow", ["n"] = "allow", ["output_config"] = "allow", ["output_dimension"] = "allow", ["padding"] = "allow", ["parallel_tool_calls"] = "allow", ["presence_penalty"] = "allow", ["previous_input_messages"] = "allow", ["previous_response_id"] = "allow", ["priority"] = "reject", ["prompt"] = "allow", ["prompt_cache_key"] = "reject", ["prompt_cache_options"] = "reject", ["prompt_cache_retention"] = "reject", ["prompt_embeds"] = "reject", ["prompt_logprobs"] = "allow", ["queries"] = "allow", ["query"] = "allow", ["reasoning"] = "allow", ["reasoning_effort"] = "allow", ["repetition_detection"] = "allow", ["repetition_penalty"] = "allow", ["request_id"] = "reject", ["response_format"] = "allow", ["return_assistant_tokens_mask"] = "allow", ["return_mm_kwargs"] = "reject", ["return_prompt_text"] = "allow", ["return_token_ids"] = "allow", ["return_token_offsets"] = "allow", ["return_tokens_as_token_ids"] = "allow", ["return_weight_versions"] = "allow", ["routed_experts_prompt_start"] = "reject", ["safety_identifier"] = "allow", ["seed"] = "allow", ["service_tier"] = "allow", ["session_id"] = "reject", ["skip_special_tokens"] = "allow", ["spaces_between_special_tokens"] = "allow", ["stop"] = "allow", ["stop_sequences"] = "allow", ["stop_token_ids"] = "allow", ["store"] = "allow", ["stream"] = "allow", ["stream_continuous_usage_stats"] = "allow", ["stream_include_usage"] = "allow", ["stream_interval"] = "reject", ["stream_options"] = "allow", ["structured_outputs"] = "reject", ["suffix"] = "allow", ["system"] = "allow", ["temperature"] = "allow", ["text"] = "allow", ["text_1"] = "allow", ["text_2"] = "allow", ["texts"] = "allow", ["thinking"] = "allow", ["thinking_token_budget"] = "allow", ["to_language"] = "allow", ["tool_choice"] = "allow", ["tools"] = "allow", ["top_k"] = "allow", ["top_logprobs"] = "allow", ["top_n"] = "allow", ["top_p"] = "allow", ["truncate"] = "allow", ["truncate_prompt_tokens"] = "allow", ["truncation"] = "allow", ["truncation_side"] = "allow", ["use_activation"] = "allow", ["use_beam_search"] = "allow", ["user"] = "allow", ["vllm_xargs"] = "reject", ["watermarking"] = "allow"}}, {["op"] = "count", ["field"] = "bad_words", ["max"] = 64}, {["op"] = "count", ["field"] = "logit_bias", ["max"] = 300}, {["op"] = "count", ["field"] = "messages", ["max"] = 1024}, {["op"] = "count", ["field"] = "stop", ["max"] = 16}, {["op"] = "count", ["field"] = "stop_token_ids", ["max"] = 64}, {["op"] = "count", ["field"] = "tools", ["max"] = 128}, {["op"] = "media", ["hosts"] = {}, ["urls"] = "deny", ["domains"] = {}, ["data"] = 524288, ["items"] = 8, ["embeds"] = "deny"}, {["op"] = "budget", ["names"] = {"max_tokens"}, ["level"] = {"max_tokens"}, ["fields"] = {"max_tokens"}, ["field"] = "max_tokens", ["absent"] = "inject", ["cap"] = 4096, ["window"] = 0}, {["op"] = "envelope", ["items"] = {{"prompt", "prompts"}, {"input", "prompts"}, {"messages", "prompts"}, {"texts", "each"}, {"images", "each"}, {"inputs", "each"}}, ["pairs"] = {{"query", "documents"}, {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}}, ["per"] = {"n", "best_of"}, ["out"] = {"max_tokens"}, ["rest"] = 4096, ["max_sequences"] = 16, ["max_tokens"] = 1114112}},
  ["r7"] = {{["op"] = "cap", ["path"] = "best_of", ["max"] = 4}, {["op"] = "cap", ["path"] = "logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "max_completion_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_output_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "max_tokens", ["max"] = 4096}, {["op"] = "cap", ["path"] = "n", ["max"] = 4}, {["op"] = "cap", ["path"] = "prompt_logprobs", ["max"] = 20}, {["op"] = "cap", ["path"] = "top_logprobs", ["max"] = 20}, {["op"] = "keys", ["unknown"] = "reject", ["modes"] = {["add_generation_prompt"] = "allow", ["add_special_tokens"] = "allow", ["allowed_token_ids"] = "allow", ["background"] = "allow", ["bad_words"] = "allow", ["best_of"] = "allow", ["cache_salt"] = "reject", ["chat_template"] = "reject", ["chat_template_kwargs"] = "reject", ["continue_final_message"] = "allow", ["data_1"] = "allow", ["data_2"] = "allow", ["dimensions"] = "allow", ["documents"] = "allow", ["ec_transfer_params"] = "reject", ["echo"] = "allow", ["embed_dtype"] = "allow", ["embedding_types"] = "allow", ["enable_response_messages"] = "allow", ["encoding_format"] = "allow", ["endianness"] = "allow", ["file"] = "allow", ["frequency_penalty"] = "allow", ["hotwords"] = "allow", ["ignore_eos"] = "reject", ["images"] = "allow", ["include"] = "allow", ["include_reasoning"] = "allow", ["include_stop_str_in_output"] = "allow", ["input"] = "allow", ["input_type"] = "allow", ["inputs"] = "allow", ["instruction"] = "allow", ["instructions"] = "allow", ["items"] = "allow", ["kv_transfer_params"] = "reject", ["language"] = "allow", ["length_penalty"] = "allow", ["logit_bias"] = "allow", ["logprob_token_ids"] = "allow", ["logprobs"] = "allow", ["max_completion_tokens"] = "allow", ["max_output_tokens"] = "allow", ["max_tokens"] = "allow", ["max_tokens_per_doc"] = "allow", ["max_tokens_per_query"] = "allow", ["max_tool_calls"] = "allow", ["media_io_kwargs"] = "reject", ["messages"] = "allow", ["metadata"] = "allow", ["min_p"] = "allow", ["min_tokens"] = "allow", ["mm_payload"] = "reject", ["mm_processor_kwargs"] = "reject", ["model"] = "allow", ["n"] = "allow", ["output_config"] = "allow", ["output_dimension"] = "allow", ["padding"] = "allow", ["parallel_tool_calls"] = "allow", ["presence_penalty"] = "allow", ["previous_input_messages"] = "allow", ["previous_response_id"] = "allow", ["priority"] = "reject", ["prompt"] = "allow", ["prompt_cache_key"] = "reject", ["prompt_cache_options"] = "reject", ["prompt_cache_retention"] = "reject", ["prompt_embeds"] = "reject", ["prompt_logprobs"] = "allow", ["queries"] = "allow", ["query"] = "allow", ["reasoning"] = "allow", ["reasoning_effort"] = "allow", ["repetition_detection"] = "allow", ["repetition_penalty"] = "allow", ["request_id"] = "reject", ["response_format"] = "allow", ["return_assistant_tokens_mask"] = "allow", ["return_mm_kwargs"] = "reject", ["return_prompt_text"] = "allow", ["return_token_ids"] = "allow", ["return_token_offsets"] = "allow", ["return_tokens_as_token_ids"] = "allow", ["return_weight_versions"] = "allow", ["routed_experts_prompt_start"] = "reject", ["safety_identifier"] = "allow", ["seed"] = "allow", ["service_tier"] = "allow", ["session_id"] = "reject", ["skip_special_tokens"] = "allow", ["spaces_between_special_tokens"] = "allow", ["stop"] = "allow", ["stop_sequences"] = "allow", ["stop_token_ids"] = "allow", ["store"] = "allow", ["stream"] = "allow", ["stream_continuous_usage_stats"] = "allow", ["stream_include_usage"] = "allow", ["stream_interval"] = "reject", ["stream_options"] = "allow", ["structured_outputs"] = "reject", ["suffix"] = "allow", ["system"] = "allow", ["temperature"] = "allow", ["text"] = "allow", ["text_1"] = "allow", ["text_2"] = "allow", ["texts"] = "allow", ["thinking"] = "allow", ["thinking_token_budget"] = "allow", ["to_language"] = "allow", ["tool_choice"] = "allow", ["tools"] = "allow", ["top_k"] = "allow", ["top_logprobs"] = "allow", ["top_n"] = "allow", ["top_p"] = "allow", ["truncate"] = "allow", ["truncate_prompt_tokens"] = "allow", ["truncation"] = "allow", ["truncation_side"] = "allow", ["use_activation"] = "allow", ["use_beam_search"] = "allow", ["user"] = "allow", ["vllm_xargs"] = "reject", ["watermarking"] = "allow"}}, {["op"] = "count", ["field"] = "bad_words", ["max"] = 64}, {["op"] = "count", ["field"] = "logit_bias", ["max"] = 300}, {["op"] = "count", ["field"] = "messages", ["max"] = 1024}, {["op"] = "count", ["field"] = "stop", ["max"] = 16}, {["op"] = "count", ["field"] = "stop_token_ids", ["max"] = 64}, {["op"] = "count", ["field"] = "tools", ["max"] = 128}, {["op"] = "media", ["hosts"] = {}, ["urls"] = "deny", ["domains"] = {}, ["data"] = 524288, ["items"] = 8, ["embeds"] = "deny"}, {["op"] = "budget", ["names"] = {"max_output_tokens"}, ["level"] = {"max_output_tokens"}, ["fields"] = {"max_output_tokens"}, ["field"] = "max_output_tokens", ["absent"] = "inject", ["cap"] = 4096, ["window"] = 0}, {["op"] = "envelope", ["items"] = {{"prompt", "prompts"}, {"input", "prompts"}, {"messages", "prompts"}, {"texts", "each"}, {"images", "each"}, {"inputs", "each"}}, ["pairs"] = {{"query", "documents"}, {"queries", "documents"}, {"queries", "items"}, {"data_1", "data_2"}, {"text_1", "text_2"}}, ["per"] = {"n", "best_of"}, ["out"] = {"max_output_tokens"}, ["rest"] = 4096, ["max_sequences"] = 16, ["max_tokens"] = 1114112}},
}
local CHECKS = {["c1"] = "r1", ["c2"] = "r2", ["c3"] = "r3", ["c4"] = "r4", ["c5"] = "r5", ["c6"] = "r6", ["c7"] = "r7"}
local KEY_CACHE, AUTH_MAX = 4096, 512

-- SHA-256 (FIPS 180-4) in pure Lua with LuaJIT's bit library (included in envoy_perimeter.lua.j2).
local bit = require("bit")
local band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
local rshift, lshift, ror, tobit, tohex = bit.rshift, bit.lshift, bit.ror, bit.tobit, bit.tohex
local rep = string.rep

local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

-- The SHA-256 of a string, as 64 lowercase hex digits.
local function sha256_hex(msg)
  local len = #msg
  local bits = len * 8
  local hi, lo = math.floor(bits / 0x100000000), bits % 0x100000000
  msg = msg .. "\128" .. rep("\0", (55 - len) % 64)
      .. char(band(rshift(hi, 24), 255), band(rshift(hi, 16), 255), band(rshift(hi, 8), 255),
              band(hi, 255), band(rshift(lo, 24), 255), band(rshift(lo, 16), 255),
              band(rshift(lo, 8), 255), band(lo, 255))
  local h0, h1, h2, h3 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
  local h4, h5, h6, h7 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
  local w = {}
  for at = 1, #msg, 64 do
    for i = 0, 15 do
      local a, b, c, d = byte(msg, at + i * 4, at + i * 4 + 3)
      w[i] = bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
    end
    for i = 16, 63 do
      local x, y = w[i - 15], w[i - 2]
      local s0 = bxor(ror(x, 7), ror(x, 18), rshift(x, 3))
      local s1 = bxor(ror(y, 17), ror(y, 19), rshift(y, 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
    for i = 0, 63 do
      local s1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = h + s1 + ch + K[i + 1] + w[i]
      local s0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
      local maj = bxor(band(a, b), band(a, c), band(b, c))
      h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + s0 + maj)
    end
    h0, h1, h2, h3 = tobit(h0 + a), tobit(h1 + b), tobit(h2 + c), tobit(h3 + d)
    h4, h5, h6, h7 = tobit(h4 + e), tobit(h5 + f), tobit(h6 + g), tobit(h7 + h)
  end
  return tohex(h0) .. tohex(h1) .. tohex(h2) .. tohex(h3)
      .. tohex(h4) .. tohex(h5) .. tohex(h6) .. tohex(h7)
end

-- f memoised in this worker's memory (a credential's hash or principal: never logged): at most
-- `most` values, then emptied; a text over `longest` bytes is not kept.
local function memo(most, longest, f)
  local cache, n = {}, 0
  return function(text)
    local hit = cache[text]
    if hit ~= nil then
      return hit
    end
    hit = f(text)
    if #text <= longest then
      if n >= most then
        cache, n = {}, 0
      end
      cache[text], n = hit, n + 1
    end
    return hit
  end
end

-- JSON reading and writing (included in envoy_perimeter.lua.j2; LuaJIT here has no cjson).
-- A body is read as Python's json module (and so vLLM) reads it: escaped keys decoded, a
-- duplicated key holds its last value in its first place (parse); numbers are read as vLLM
-- reads an integer field (int_value: pydantic's lax reading, scanner/plan/vllm_json.py).
local MAX_DEPTH = 128
-- The most nesting a body may have (scanner/rules.py BODY_DEPTH; the root object is level 1):
-- parse refuses a deeper one, and the check gives it its own reason (nested_over).
local BODY_DEPTH = 31

-- Index after the whitespace at i, and the byte there.
local function ws(s, i)
  local c = byte(s, i)
  while c == 32 or c == 10 or c == 13 or c == 9 do
    i = i + 1
    c = byte(s, i)
  end
  return i, c
end

-- Only plain finds, string.byte and string.sub below: LuaJIT compiles them (pattern
-- matching would run interpreted, ~30 times slower on a 4 KB body).

-- s[i] is '"': the index of the closing quote, or nil.
local function string_end(s, i)
  local j = i
  while true do
    j = find(s, '"', j + 1, true)
    if j == nil then
      return nil
    end
    if byte(s, j - 1) ~= 92 then
      return j
    end
    local k = j - 1
    while byte(s, k) == 92 do
      k = k - 1
    end
    if (j - 1 - k) % 2 == 0 then
      return j
    end
  end
end

local SIMPLE = {[34] = '"', [92] = "\\", [47] = "/", [98] = "\b", [102] = "\f", [110] = "\n",
                [114] = "\r", [116] = "\t"}

-- A code point as UTF-8, as Python decodes a \u escape or a pair of them (a lone surrogate
-- becomes "\255": never equal to an ASCII name or digit; string_ok refuses a body with one).
local function utf8(cp)
  if cp < 128 then
    return char(cp)
  elseif cp < 2048 then
    return char(192 + math.floor(cp / 64), 128 + cp % 64)
  elseif cp >= 55296 and cp <= 57343 then
    return "\255"
  elseif cp < 65536 then
    return char(224 + math.floor(cp / 4096), 128 + math.floor(cp / 64) % 64, 128 + cp % 64)
  end
  return char(240 + math.floor(cp / 262144), 128 + math.floor(cp / 4096) % 64, 128 + math.floor(cp / 64) % 64,
              128 + cp % 64)
end

-- The text of the string body s[a..b], strictly validated (escapes, no control bytes); nil if
-- invalid, and with strict (a token's parts) if it holds a \u escape of a lone surrogate (a high
-- one not followed at once by a low one, or a low one alone): jwt_authn's JSON parser refuses
-- those. The runs between escapes are copied whole.
local function decode(s, a, b, strict)
  for k = a, b do
    if byte(s, k) < 32 then
      return nil
    end
  end
  local k = find(s, "\\", a, true)
  if k == nil or k > b then
    return sub(s, a, b)
  end
  local out, i, high, hcp = {}, a, false, 0   -- high: the escape before was a high surrogate (hcp)
  while true do
    if k == nil or k > b then
      out[#out + 1] = sub(s, i, b)
      return not (strict and high) and concat(out) or nil
    end
    out[#out + 1] = sub(s, i, k - 1)
    local e = byte(s, k + 1)
    if e == 117 and k + 5 <= b and match(sub(s, k + 2, k + 5), "^%x%x%x%x$") then
      local cp = tonumber(sub(s, k + 2, k + 5), 16)
      local low = cp >= 56320 and cp <= 57343
      if strict and ((high and k > i) or high ~= low) then
        return nil
      end
      if high and low and k == i then   -- the pair's one character, as Python reads it
        out[#out - 1] = utf8(65536 + (hcp - 55296) * 1024 + cp - 56320)
      else
        out[#out + 1] = utf8(cp)
      end
      high, hcp = not low and cp >= 55296 and cp <= 56319, cp
      i = k + 6
    elseif k + 1 <= b and SIMPLE[e] ~= nil and not (strict and high) then
      out[#out + 1] = SIMPLE[e]
      i = k + 2
    else
      return nil
    end
    k = find(s, "\\", i, true)
  end
end

-- Is the string body s[a..b] valid as the reference reads it: no control byte, every escape whole,
-- no \u escape of a lone surrogate (a high one not followed at once by a low one, a low one
-- alone: Python's json reads one, njs reads U+FFFD, decode here one byte for any, so two names
-- distinct to vLLM were one here; scanner/plan/body.py document refuses such a body)? What
-- decode checks with strict, without building the text: every string of a body, read or not.
local function string_ok(s, a, b)
  for k = a, b do
    if byte(s, k) < 32 then
      return false
    end
  end
  local k, i, high = find(s, "\\", a, true), a, false
  while k ~= nil and k <= b do
    local e = byte(s, k + 1)
    if e == 117 and k + 5 <= b and match(sub(s, k + 2, k + 5), "^%x%x%x%x$") then
      local cp = tonumber(sub(s, k + 2, k + 5), 16)
      local low = cp >= 56320 and cp <= 57343
      if (high and k > i) or high ~= low then
        return false
      end
      high = not low and cp >= 55296 and cp <= 56319
      i = k + 6
    elseif k + 1 <= b and SIMPLE[e] ~= nil and not high then
      i = k + 2
    else
      return false
    end
    k = find(s, "\\", i, true)
  end
  return not high
end

-- Each byte that can lead a UTF-8 sequence as Python's codec reads it: {its length, the lowest
-- and the highest second byte} (no overlong form, no surrogate, nothing over U+10FFFF).
local LEAD = {}
for c = 194, 244 do
  LEAD[c] = {c < 224 and 2 or c < 240 and 3 or 4, c == 224 and 160 or c == 240 and 144 or 128,
             c == 237 and 159 or c == 244 and 143 or 191}
end

-- Is s valid UTF-8 as Python's codec (and so the reference and vLLM) reads it? ASCII runs in one
-- compiled loop; parse does not check it.
local function utf8_valid(s)
  local n, i = #s, 1
  while i <= n do
    local c = byte(s, i)
    if c < 128 then
      i = i + 1
    else
      local lead, d = LEAD[c], byte(s, i + 1)
      if lead == nil or d == nil or d < lead[2] or d > lead[3] then
        return false
      end
      for k = i + 2, i + lead[1] - 1 do
        d = byte(s, k)
        if d == nil or d < 128 or d > 191 then
          return false
        end
      end
      i = i + lead[1]
    end
  end
  return true
end

local function digits(s, i)
  local c = byte(s, i)
  while c ~= nil and c >= 48 and c <= 57 do
    i = i + 1
    c = byte(s, i)
  end
  return i
end

-- s[i] starts a number: the index after it, or nil (JSON grammar, as Python's json).
local function number_end(s, i)
  i = byte(s, i) == 45 and i + 1 or i
  local j = byte(s, i) == 48 and i + 1 or digits(s, i)   -- a leading 0 is the whole integer part
  if j == i then
    return nil
  end
  if byte(s, j) == 46 then   -- a fraction: at least one digit
    i, j = j + 1, digits(s, j + 1)
    if j == i then
      return nil
    end
  end
  local c = byte(s, j)
  if c == 101 or c == 69 then   -- an exponent: a sign, then at least one digit
    c = byte(s, j + 1)
    i = (c == 43 or c == 45) and j + 2 or j + 1
    j = digits(s, i)
    if j == i then
      return nil
    end
  end
  return j
end

-- A JSON value at s[i]: the index after it, or nil when invalid or an array or object in it is
-- deeper than most (depth: the value's level less one). With read, then the value decoded: strings,
-- numbers, true / false, NULL; an array a list with the LIST metatable; an object a table of its
-- names (a name twice: its last value) with obj[ORDER] the names in document order; strict (a
-- token's parts): also refused a name twice, a number not finite. Every string, read or not, name
-- or value, is validated (string_ok: a control byte, a broken escape, a lone surrogate escape
-- refused, as the reference refuses the body). Unread, then an array's or object's element count.
-- doc (parse: the object at s[i] unread): each member's name, its text and its value's text (and
-- an array's count) kept in doc.
local LIST, ORDER = {}, {}
local function walk(s, i, depth, most, read, strict, doc)
  local c = byte(s, i)
  if c == 34 then
    local j = string_end(s, i)
    if j == nil or not string_ok(s, i + 1, j - 1) then
      return nil
    elseif not read then
      return j + 1
    end
    local text = decode(s, i + 1, j - 1, strict)
    return text and j + 1, text
  elseif c == 123 or c == 91 then
    if depth > most then
      return nil
    end
    local obj, close = c == 123, c == 123 and 125 or 93
    local out = read and (obj and {[ORDER] = {}} or setmetatable({}, LIST))
    i, c = ws(s, i + 1)
    if c == close then
      return i + 1, out or 0
    end
    local count, key, kstart, kend, vstart, v = 0, nil, nil, nil, nil, nil
    while true do
      count = count + 1
      if obj then
        kstart, kend = i, c == 34 and string_end(s, i)
        if kend and not string_ok(s, i + 1, kend - 1) then
          return nil
        end
        key = kend and ((not read and not doc) or decode(s, i + 1, kend - 1, strict))
        if not key or (strict and out[key] ~= nil) then
          return nil
        end
        i, c = ws(s, kend + 1)
        if c ~= 58 then
          return nil
        end
        i = ws(s, i + 1)
      end
      vstart = i
      i, v = walk(s, i, depth + 1, most, read, strict)
      if i == nil then
        return nil
      elseif doc then   -- a name twice: its last value in its first place
        if doc.kt[key] == nil then
          doc.keys[#doc.keys + 1], doc.kt[key] = key, sub(s, kstart, kend)
        end
        doc.v[key] = sub(s, vstart, i - 1)
        if byte(s, vstart) == 91 then
          doc.n = doc.n or {}
          doc.n[key] = v
        elseif doc.n ~= nil then
          doc.n[key] = nil
        end
      elseif read and obj then
        if out[key] == nil then
          out[ORDER][#out[ORDER] + 1] = key
        end
        out[key] = v
      elseif read then
        out[count] = v
      end
      i, c = ws(s, i)
      if c == close then
        return i + 1, out or count
      end
      if c ~= 44 then
        return nil
      end
      i, c = ws(s, i + 1)
    end
  elseif c == 116 then
    return sub(s, i, i + 3) == "true" and i + 4 or nil, true
  elseif c == 102 then
    return sub(s, i, i + 4) == "false" and i + 5 or nil, false
  elseif c == 110 then
    return sub(s, i, i + 3) == "null" and i + 4 or nil, NULL
  end
  local j = number_end(s, i)
  if not read or j == nil then
    return j
  end
  local x = tonumber(sub(s, i, j - 1))
  if strict and (x ~= x or x == math.huge or x == -math.huge) then
    return nil
  end
  return j, x
end

-- walk unread past BODY_DEPTH refused: the index after the value, an array's or object's count.
local function skip_value(s, i, depth)
  return walk(s, i, depth, BODY_DEPTH - 1, false)
end

-- The value walk reads at s[i] and the index after it; nil when invalid.
local function json_value(s, i, depth, most, strict)
  local j, v = walk(s, i, depth, most, true, strict)
  return j and v, j
end

-- The whitespace pydantic trims around a numeric string (Rust's char::is_whitespace), in UTF-8:
-- generated from scanner/plan/vllm_json.py WHITESPACE. int_ws: the index after any at t[i].
local WS = { ["\009"] = true, ["\010"] = true, ["\011"] = true, ["\012"] = true, ["\013"] = true, [" "] = true, ["\194\133"] = true, ["\194\160"] = true, ["\225\154\128"] = true, ["\226\128\128"] = true, ["\226\128\129"] = true, ["\226\128\130"] = true, ["\226\128\131"] = true, ["\226\128\132"] = true, ["\226\128\133"] = true, ["\226\128\134"] = true, ["\226\128\135"] = true, ["\226\128\136"] = true, ["\226\128\137"] = true, ["\226\128\138"] = true, ["\226\128\168"] = true, ["\226\128\169"] = true, ["\226\128\175"] = true, ["\226\129\159"] = true, ["\227\128\128"] = true, }
local function int_ws(t, i)
  local n = WS[sub(t, i, i)] and 1 or WS[sub(t, i, i + 1)] and 2 or WS[sub(t, i, i + 2)] and 3
  return n and int_ws(t, i + n) or i
end

-- A numeric string's value as pydantic reads it for an integer field (scanner/plan/vllm_json.py
-- vllm_int, INT_TEXT between int_ws's whitespace); nil for anything else (hex, exponents, '1__0',
-- '1_', '10.5', '1.'). A Lua pattern, run interpreted: only a string-valued integer field pays it.
local function int_text(t)
  local sign, num, frac, stop = match(t, "^([+-]?)(%d[%d_]*)(%.?0*)()", int_ws(t, 1))
  if num == nil or find(num, "__", 1, true) or byte(num, -1) == 95 or frac == "."
     or int_ws(t, stop) <= #t then
    return nil
  end
  local v = tonumber((gsub(num, "_", "")))
  return sign == "-" and -v or v
end

-- The JSON value text v as vLLM reads an integer field (pydantic's lax mode): true / false
-- 1 / 0, a whole number within 64 bits, a numeric string (int_text); nil: refused by vLLM (or
-- null, a list, an object).
local function int_value(v)
  local c = byte(v, 1)
  if c == 116 then
    return 1
  elseif c == 102 then
    return 0
  elseif c == 34 then
    local text = decode(v, 2, #v - 1)
    return text and int_text(text)
  elseif c == 45 or (c ~= nil and c >= 48 and c <= 57) then
    local n = tonumber(v)
    if n ~= nil and n == math.floor(n) and n >= -2 ^ 63 and n < 2 ^ 63 then
      return n
    end
  end
  return nil
end

local function present(v)
  return v ~= nil and v ~= "null"
end

-- A dotted path's names ("sampling_params.n": {"sampling_params", "n"}), split once per path.
local PATH_NAMES = {}
local function path_names(path)
  local names = PATH_NAMES[path]
  if names == nil then
    names = {}
    for name in string.gmatch(path, "[^.]+") do
      names[#names + 1] = name
    end
    PATH_NAMES[path] = names
  end
  return names
end

-- The JSON object text s as {keys = its names in document order, v = name -> the value's text
-- (the last copy), kt = name -> the name's text, n = name -> the elements of a value that is an
-- array (nil: no array; put forgets a written one)}; nil when s is not one valid JSON object.
local function parse(s)
  local i, c = ws(s, 1)
  local doc = {keys = {}, v = {}, kt = {}}
  local j = c == 123 and walk(s, i, 0, BODY_DEPTH - 1, false, nil, doc)
  return j and ws(s, j) > #s and doc or nil
end

-- The top-level values of a JSON object text (name -> value text); nil: not one.
local function values(s)
  local doc = parse(s)
  return doc and doc.v
end

-- The value text at a name or dotted path (scanner/plan/vllm_json.py at: through object members);
-- nil: absent on the way; and true when an object on the way is not valid JSON (a name the
-- top-level parse skipped unread is malformed: Python's json refuses the whole body).
local function at(doc, path)
  local names = path_names(path)
  local v = doc.v[names[1]]
  for k = 2, #names do
    local inner = v ~= nil and byte(v, 1) == 123 and parse(v)
    if inner == nil then
      return nil, true
    end
    v = inner and inner.v[names[k]] or nil
  end
  return v
end

local function json_string(s)
  return '"' .. gsub(s, '[%c"\\]', function(c) return string.format("\\u%04x", byte(c)) end) .. '"'
end

-- A scalar of a program (a pin's value) as JSON text.
local function json_text(v)
  if v == NULL then
    return "null"
  elseif type(v) == "string" then
    return json_string(v)
  elseif type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then
    return string.format("%d", v)
  elseif type(v) == "number" then
    return string.format("%.17g", v)
  end
  return tostring(v)
end

-- Write the value text raw (nil: delete) at name in doc.
local function put(doc, name, raw)
  if doc.kt[name] == nil then
    doc.keys[#doc.keys + 1], doc.kt[name] = name, json_string(name)
  end
  doc.v[name], doc.dirty = raw, true
  if doc.n ~= nil then
    doc.n[name] = nil
  end
end

local function encode(doc)
  local out = {}
  for j = 1, #doc.keys do
    local v = doc.v[doc.keys[j]]
    if v ~= nil then
      out[#out + 1] = doc.kt[doc.keys[j]] .. ":" .. v
    end
  end
  return "{" .. concat(out, ",") .. "}"
end

-- Is the text s nested deeper than most (brackets open at once outside strings, whether or not
-- s is valid JSON: scanner/plan/body.py nesting, the reference)?
local function nested_over(s, most)
  local depth, k, n = 0, 1, #s
  while k <= n do
    local b = byte(s, k)
    if b == 34 then   -- a string: to the next quote not escaped, or the end
      k = string_end(s, k)
      if k == nil then
        return false
      end
    elseif b == 123 or b == 91 then
      depth = depth + 1
      if depth > most then
        return true
      end
    elseif b == 125 or b == 93 then
      depth = depth - 1
    end
    k = k + 1
  end
  return false
end

-- Media (scanner/policy/media.py items, reason): the body decoded (json_value), then every media
-- key at any depth judged. MEDIA: each media key's kind (media.py KEY_KINDS, generated).
local MEDIA = {["image_url"] = "url", ["audio_url"] = "url", ["video_url"] = "url", ["file_url"] = "url", ["images"] = "list", ["videos"] = "list", ["audio"] = "list", ["input_audio"] = "input_audio", ["file_data"] = "file_data", ["image_embeds"] = "embeds", ["audio_embeds"] = "embeds", ["video_embeds"] = "embeds", ["source"] = "source"}
local MEDIA_SHORTEST, MEDIA_LONGEST = math.huge, 0
for name in pairs(MEDIA) do
  MEDIA_SHORTEST, MEDIA_LONGEST = math.min(MEDIA_SHORTEST, #name), math.max(MEDIA_LONGEST, #name)
end
local HEX_AT = {}
for n = 0, 15 do
  HEX_AT[byte("0123456789abcdef", n + 1)], HEX_AT[byte("0123456789ABCDEF", n + 1)] = n, n
end

-- The media walk's fast path, one pass over a JSON value's text v: true when json_value reads v
-- without a refusal (no control byte in a string, every escape one decode takes, nesting well
-- within MAX_DEPTH) and no string in it can name a media key (none of MEDIA's names; no
-- \u escape of an ASCII character, which could spell one): media_walk then finds nothing in v.
-- false: not sure, the walk decides (it is exact). No table, no string but a few short names.
local function media_free(v)
  local k, n, depth, start, plain = 1, #v, 0, 0, true
  while k <= n do
    local b = byte(v, k)
    if start > 0 then   -- in a string opened at start
      if b == 34 then
        local len = k - start - 1
        if plain and len >= MEDIA_SHORTEST and len <= MEDIA_LONGEST
           and MEDIA[sub(v, start + 1, k - 1)] then
          return false
        end
        start = 0
      elseif b == 92 then
        plain = false   -- an escape decodes to no letter, digit or "_" (\u below: not ASCII)
        local e = byte(v, k + 1)
        if e == 117 then   -- past the end: fewer bytes, a nil digit
          local h1, h2, h3, h4 = byte(v, k + 2, k + 5)
          h1, h2, h3, h4 = HEX_AT[h1], HEX_AT[h2], HEX_AT[h3], HEX_AT[h4]
          if h1 == nil or h2 == nil or h3 == nil or h4 == nil or (h1 == 0 and h2 == 0 and h3 < 8) then
            return false
          end
          k = k + 5
        elseif SIMPLE[e] ~= nil then
          k = k + 1
        else
          return false
        end
      elseif b < 32 then
        return false
      end
    elseif b == 34 then
      start, plain = k, true
    elseif b == 123 or b == 91 then
      depth = depth + 1
      if depth > MAX_DEPTH - 8 then
        return false
      end
    elseif b == 125 or b == 93 then
      depth = depth - 1
    elseif b < 32 and b ~= 10 and b ~= 13 and b ~= 9 then
      return false
    end
    k = k + 1
  end
  return start == 0 and depth == 0
end

-- Is there no media item in the top-level object doc (parse's form), and would json_value read
-- each of its values? (true: OPS.media's walk would admit it without finding any; false: walk.)
local function media_free_doc(doc)
  for j = 1, #doc.keys do
    local key = doc.keys[j]
    local v = doc.v[key]
    if v ~= nil and (MEDIA[key] or not media_free(v)) then
      return false
    end
  end
  return true
end

local function data_reason(text, media)
  if media.data ~= NULL and #text > media.data then
    return "media-data:over-" .. media.data
  end
  return nil
end

-- The lower-cased host and the port ("" none) of an http(s) URL (url_reason checked the scheme)
-- in the plain form every parser reads alike (media.py _CANONICAL); nil for any other form. Lua
-- patterns: only a URL judged against listed domains pays them.
local function plain_host(url)
  local start = lower(sub(url, 1, 7)) == "http://" and 8 or 9
  local host, k = match(url, "^([0-9A-Za-z.%-]+)()", start)
  if host == nil or byte(host, 1) == 46 or byte(host, -1) == 46 or find(host, "..", 1, true) then
    return nil
  end
  local port = ""
  if byte(url, k) == 58 then
    port, k = match(url, "^(%d%d?%d?%d?%d?)()", k + 1)
    if port == nil then
      return nil
    end
  end
  local rest = sub(url, k)   -- '/', '?', '#' or the end; no backslash, space, control, non-ASCII
  if rest ~= "" and (not find("/?#", sub(rest, 1, 1), 1, true) or find(rest, "[^!-~]")
                     or find(rest, "\\", 1, true)) then
    return nil
  end
  return lower(host), port
end

-- hosts: the media step's domains as {name, port, suffix} (envoy_model.py _lua_step splits them).
local function host_listed(host, port, hosts)
  for j = 1, #hosts do
    local name, want, suffix = hosts[j][1], hosts[j][2], hosts[j][3]
    if want == port and (name == host
                         or (suffix and #host > #suffix and sub(host, -#suffix) == suffix)) then
      return true
    end
  end
  return false
end

local function url_reason(url, media)
  if lower(sub(url, 1, 5)) == "data:" then
    return data_reason(url, media)
  end
  if media.urls == "pass" then
    return nil
  end
  if media.urls == "deny" then
    return "media-url:denied"
  end
  if lower(sub(url, 1, 7)) ~= "http://" and lower(sub(url, 1, 8)) ~= "https://" then
    return "media-url:scheme"
  end
  if #media.domains == 0 then
    return nil
  end
  local host, port = plain_host(url)
  if host == nil then
    return "media-url:not-canonical"
  end
  return (not host_listed(host, port, media.hosts)) and "media-url:host" or nil
end

-- The item of a media key's value other than a list's (media.py _item; kind: MEDIA's): "url" or
-- "data" and its text, "embeds", "other" (counted, nothing to judge), or nil (a source without).
local function media_item(kind, val)
  local obj = type(val) == "table" and val[ORDER] ~= nil
  local url = obj and type(val.url) == "string" and val.url
  local data = obj and type(val.data) == "string" and val.data
  if kind == "url" then
    url = type(val) == "string" and val or url
    return url and "url" or "other", url
  elseif kind == "source" then
    return url and "url" or data and "data" or nil, url or data
  elseif kind == "input_audio" then
    return data and "data" or "other", data
  elseif kind == "file_data" then
    return type(val) == "string" and "data" or "other", val
  end
  return "embeds"
end

-- Every media item in v (json_value's form) judged, depth first in document order, a key's own
-- item before those inside its value: the first refusal reason, or nil; seen.n counts the items.
local function media_walk(v, media, seen)
  if type(v) ~= "table" or v == NULL then
    return nil
  end
  local names = v[ORDER]
  for k = 1, names and #names or #v do
    local val, kind, why = v[k], nil, nil
    if names then
      val, kind = v[names[k]], MEDIA[names[k]]
    end
    if kind == "list" and getmetatable(val) == LIST then   -- images, videos, audio: each string
      for j = 1, #val do
        if type(val[j]) == "string" then
          seen.n, why = seen.n + 1, url_reason(val[j], media)
          if why then
            return why
          end
        end
      end
    elseif kind and kind ~= "list" and val ~= NULL then
      local item, text = media_item(kind, val)
      seen.n = seen.n + (item and 1 or 0)
      if item == "url" then
        why = url_reason(text, media)
      elseif item == "data" then
        why = data_reason(text, media)
      elseif item == "embeds" and media.embeds == "deny" then
        why = "media-embeds"
      end
    end
    why = why or media_walk(val, media, seen)
    if why then
      return why
    end
  end
  return nil
end

-- nil when the media of doc (json_value's form) pass the rules; else the refusal reason.
local function media_check(doc, media)
  local seen = {n = 0}
  local why = media_walk(doc, media, seen)
  if why == nil and media.items ~= NULL and seen.n > media.items then
    return "media-items:over-" .. media.items
  end
  return why
end

-- Form bodies (multipart, urlencoded) are not JSON: not parsed here (FastAPI does not read
-- them as JSON either; vLLM's JSON endpoints refuse other content types). The whole media type
-- before any ';' must be one of them (scanner/plan/body.py is_form): FastAPI reads
-- "application/x-www-form-urlencoded x+json" as JSON, so it is inspected.
local function is_form(content_type)
  local media = content_type and match(lower(content_type) .. ";", "^%s*([^;]-)%s*;")
  return media == "multipart/form-data" or media == "application/x-www-form-urlencoded"
end

-- The rule program's interpreter (scanner/plan/interpret.py is the reference): each op is
-- (step, run) -> a refusal reason, or nil; the steps read and write one working body (run.doc,
-- parse's form), in program order. run: size (the body's bytes as received), salt (the sender's;
-- nil: none), who (the principal), strip (the fields keys stripped), written (the output budget
-- written in), what budget found (budget, budget_from: as njs logs it) and what envelope found
-- (seq, out, from, tokens, model, unreported).
local OPS = {}

local function whole(v)   -- vLLM's reading of an integer; refused: 0
  local n = int_value(v)
  return (n ~= nil and n > 0) and n or 0
end

function OPS.cap(s, r)
  local v, bad = at(r.doc, s.path)
  if bad then
    return "bad-json"   -- an object on the path holds a malformed name: Python's json refuses it
  end
  if present(v) then
    local n = int_value(v)
    if n == nil or n > s.max then
      return "json-cap:" .. s.path
    end
  end
end

function OPS.keys(s, r)
  local doc = r.doc
  for j = 1, #doc.keys do
    local key = doc.keys[j]
    local mode = doc.v[key] ~= nil and (s.modes[key] or (s.unknown == "pass" and "allow" or s.unknown))
    if mode == "reject" then
      if s.modes[key] then
        return "forbidden-field:" .. key
      end
      return "unknown-field:" .. ((#key <= 64 and match(key, "^[%w_]+$")) and key or "not-a-plain-name")
    elseif mode == "strip" then
      r.strip[key] = true
    end
  end
  for key, _ in pairs(r.strip) do
    put(doc, key, nil)
  end
end

-- Items of a value (envelope.count): null 0; not a list 1; a list: each element ("each"), or
-- its strings and lists, at least 1 ("prompts").
local function items_of(v, rule)
  local c = v and byte(v, 1)
  if c == nil or c == 110 then
    return 0
  end
  if c ~= 91 then
    return 1
  end
  local i
  i, c = ws(v, 2)
  local n, k = 0, 0
  while c ~= 93 do
    if c == 34 or c == 91 then
      k = k + 1
    end
    n = n + 1
    i = skip_value(v, i, 2)
    if i == nil then
      break
    end
    i, c = ws(v, i)
    if c == 44 then
      i, c = ws(v, i + 1)
    end
  end
  if rule == "each" then
    return n
  end
  return k > 0 and k or 1
end

-- items_of(doc.v[name], "each"), an array's elements counted once by parse.
local function elements_at(doc, name)
  return doc.n ~= nil and doc.n[name] or items_of(doc.v[name], "each")
end

-- count_of (scanner/policy/model.py): a list's elements, an object's names, null none, else 1.
function OPS.count(s, r)
  local v = r.doc.v[s.field]
  local n
  if v ~= nil and byte(v, 1) == 123 then
    local inner = parse(v)
    if inner == nil then
      return "bad-json"   -- a name parse skipped unread is malformed: Python's json refuses the body
    end
    n = #inner.keys
  else
    n = elements_at(r.doc, s.field)
  end
  if n > s.max then
    return "json-cap:" .. s.field .. ":count-over-" .. s.max
  end
end

-- values: present and not null, one of the listed values by JSON type and value (1 is 1.0, not "1")
function OPS.values(s, r)
  local text = r.doc.v[s.field]
  if not present(text) then
    return nil
  end
  local v = json_value(text, 1, 2, MAX_DEPTH)
  for j = 1, #s.values do
    if type(v) == type(s.values[j]) and v == s.values[j] then
      return nil
    end
  end
  return "json-cap:" .. s.field .. ":not-listed"
end

function OPS.media(s, r)
  if media_free_doc(r.doc) then
    return nil   -- no media item, nothing the walk refuses: the walk's own answer, without it
  end
  local top = {[ORDER] = {}}
  for j = 1, #r.doc.keys do
    local key = r.doc.keys[j]
    local v = r.doc.v[key] ~= nil and json_value(r.doc.v[key], 1, 2, MAX_DEPTH)
    if v == nil then
      return "bad-json"
    elseif r.doc.v[key] ~= nil then
      top[ORDER][#top[ORDER] + 1], top[key] = key, v
    end
  end
  return media_check(top, s)
end

function OPS.budget(s, r)
  for j = 1, #s.fields do
    local v = at(r.doc, s.fields[j])
    if present(v) then
      r.budget, r.budget_from = whole(v), "sent"
      return nil
    end
  end
  r.budget, r.budget_from = s.cap, "default"
  if s.absent == "reject" then
    return "json-cap:" .. s.field .. ":absent"
  end
  local fit = s.cap
  if s.window > 0 then
    fit = math.min(s.cap, s.window - r.size)
  end
  local names, doc = s.names, r.doc   -- the field's names (scanner/generate/envoy_model.py _lua_step)
  local parent = #names > 1 and doc.v[names[1]]
  if s.cap == 0 or fit < 1 or (#names > 1 and not (parent and byte(parent, 1) == 123)) then
    return nil   -- nothing written: vLLM's own default (or it refuses the body as sent)
  end
  r.written, r.budget, r.budget_from = fit, fit, "written"
  local obj = doc
  if #names > 1 then   -- a nested budget: its parent object rewritten
    obj = parse(parent)
    if obj == nil then
      return "bad-json"   -- as count: a malformed name inside the parent
    end
  end
  for j = 1, #s.level do   -- the budget's fields at that level dropped (all null)
    put(obj, s.level[j], nil)
  end
  put(obj, names[#names], string.format("%d", fit))
  if #names > 1 then
    put(doc, names[1], encode(obj))
  end
end

function OPS.salt(s, r)
  if r.salt == nil then
    return "bad-request:no-salt"
  end
  put(r.doc, "cache_salt", '"' .. r.salt .. '"')
end

function OPS.pin(s, r)
  put(r.doc, s.field, json_text(s.value))
end

local function pair_count(a, b)
  if a == 0 or b == 0 then
    return 0
  end
  if a ~= b and a > 1 and b > 1 then
    return a * b
  end
  return math.max(a, b)
end

-- The admitted envelope (scanner/plan/envelope.py): sequences x output per sequence + size.
function OPS.envelope(s, r)
  local v, items, per = r.doc.v, 0, 1
  for j = 1, #s.items do
    items = items + items_of(v[s.items[j][1]], s.items[j][2])
  end
  for j = 1, #s.pairs do
    items = items + pair_count(elements_at(r.doc, s.pairs[j][1]), elements_at(r.doc, s.pairs[j][2]))
  end
  for j = 1, #s.per do
    local x = at(r.doc, s.per[j])
    if present(x) then
      per = math.max(per, whole(x))
    end
  end
  r.seq, r.out, r.from = math.max(1, items) * per, 0, ""
  if #s.out > 0 then
    r.out, r.from = s.rest, "default"
    for j = 1, #s.out do
      local x = at(r.doc, s.out[j])
      if present(x) then
        r.out, r.from = whole(x), r.written and "written" or "sent"
        break
      end
    end
  end
  r.tokens = r.seq * r.out + r.size
  -- settle.unreported: best_of over n (vLLM's usage counts the returned sequences only)
  local best = present(v.best_of) and int_value(v.best_of)
  local n = present(v.n) and int_value(v.n) or (not present(v.n) and 1)
  r.unreported = best ~= false and (best == nil or not n or best > n)
  if s.max_sequences ~= NULL and r.seq > s.max_sequences then
    return "envelope-sequences:over-" .. s.max_sequences
  end
  if s.max_tokens ~= NULL and r.tokens > s.max_tokens then
    return "envelope-tokens:over-" .. s.max_tokens
  end
end

local function run_program(program, r)
  for j = 1, #program do
    local why = OPS[program[j].op](program[j], r)
    if why ~= nil then
      return why
    end
  end
end

-- A JSON body's text (not empty, not a form) read and its program run, both proxies' check:
-- nil and the run when it passes (run.doc rewritten when doc.dirty); else the status and the
-- refusal, and the run when the body was read (run.model: its model, for the access log).
local function run_body(text, program, salt, who)
  local doc = parse(text)
  if doc == nil or not utf8_valid(text) then
    if doc == nil and nested_over(text, BODY_DEPTH) then
      return "400", "bad-json:depth-over-" .. BODY_DEPTH
    end
    local i, c = ws(text, 1)
    if doc == nil and c ~= 123 and utf8_valid(text) then   -- valid JSON, not an object?
      local v, j = json_value(text, i, 1, MAX_DEPTH)
      if v ~= nil and ws(text, j) > #text then
        return "400", "bad-json:not-an-object"
      end
    end
    return "400", "bad-json"
  end
  local r = {doc = doc, size = #text, salt = salt, who = who or "", strip = {}}
  local why, model = run_program(program, r), doc.v.model
  model = model and byte(model, 1) == 34 and decode(model, 2, #model - 1)
  r.model = sub(model or "", 1, 128)
  if why ~= nil then
    return sub(why, 1, 10) == "not-owner:" and "403" or "400", why, r
  end
  return nil, nil, r
end

local key_hash = memo(KEY_CACHE, AUTH_MAX, sha256_hex)
function M.key_hash(bearer)   -- "" when there is none ($perimeter_bearer: at most 1024 characters)
  return (bearer == nil or bearer == "") and "" or key_hash(bearer)
end

local media, salt = OPS.media, OPS.salt
function OPS.media(s, r)   -- NGINX's map found no media key in any spelling: nothing to walk
  if ngx.var.perimeter_media_key == "0" then
    return nil
  end
  return media(s, r)
end

function OPS.salt(s, r)    -- the route's principal's or audience's ($perimeter_salt, as njs reads it)
  local v = ngx.var.perimeter_salt
  r.salt = v ~= "" and v or nil
  return salt(s, r)
end

local function deny(reason)
  ngx.var.perimeter_reason = reason
  return ngx.exec(sub(reason, 1, 10) == "not-owner:" and "@perimeter_403" or "@perimeter_400")
end

local function number(x)   -- as njs's String(x)
  return x < 1e21 and string.format("%.0f", x) or tostring(x)
end

-- The check of a JSON body and the access log's fields, as njs sets them.
local function check(var, text)
  local program = PROGRAMS[CHECKS[var.perimeter_check] or ""]
  if program == nil then
    error("no rule program for check " .. tostring(var.perimeter_check))
  end
  local _, why, r = run_body(text, program, nil, nil)
  if r ~= nil then
    var.perimeter_model, var.perimeter_sequences = r.model, number(r.seq or 1)
    var.perimeter_output = r.budget_from and number(r.seq and r.out or r.budget) or ""
    var.perimeter_output_from = r.budget_from or ""
  end
  return why, r
end

-- content_by_lua of a route whose every body is parsed (njs: perimeter.direct); fails closed.
function M.body()
  local var = ngx.var
  ngx.req.read_body()
  local text = ngx.req.get_body_data()
  if text == nil and ngx.req.get_body_file() ~= nil then
    return deny("body-not-in-memory")
  end
  if text ~= nil and text ~= "" and var.perimeter_form ~= "1" then
    local ok, why, r = pcall(check, var, text)
    if not ok then
      ngx.log(ngx.ERR, "perimeter: ", why)
      return deny("body-check-failed")
    elseif why ~= nil then
      return deny(why)
    elseif r.doc.dirty then
      var.perimeter_body_out = encode(r.doc)
      return ngx.exec(var.perimeter_up .. "_rewrite")
    end
  end
  return ngx.exec(var.perimeter_up .. "_checked")
end

return M
