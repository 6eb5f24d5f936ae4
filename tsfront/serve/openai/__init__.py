"""The OpenAI dialect: chat completions and completions (`completions`: `OpenAIService`, the
core's `Service` with OpenAI's routes) and their response shapes, whole and streamed
(`formats`), over `tsfront.serve.core` (whose `schema` is their request bodies: the chat
request is the form every dialect's request takes to the core).
"""
