"""A guardrail that does nothing, with the same hooks as loopwarden's: what any such guardrail costs LiteLLM's
proxy, beside which bench/litellm_guardrail.py puts loopwarden's."""

from litellm.integrations.custom_guardrail import CustomGuardrail


class NoopGuardrail(CustomGuardrail):
    use_native_lifecycle_hooks = True

    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        return data

    async def async_post_call_success_hook(self, data, user_api_key_dict, response):
        return response

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict, response, request_data):
        async for chunk in response:
            yield chunk
