"""The Responses dialect: OpenAI's ``/v1/responses`` (`endpoints`), over the chat path of
`tsfront.serve.core` and the responses store (`tsfront.serve.processes.store`).
"""
