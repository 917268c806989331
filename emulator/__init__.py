"""An emulated vLLM 0.33 / SGLang 0.5.23 server: real HTTP in front of a modelled engine.

engine.py         the pure continuous-batching engine model (shared with the simulator)
driver.py         steps it in scaled real time, delivers tokens to request queues
server.py         aiohttp app: routes, middlewares (errors, auth, http metrics), run()
generate.py       /v1/chat/completions and /v1/completions, JSON and SSE
requests.py       request validation, defaults and clamping per personality
schema.py         pydantic-shaped 400s for malformed bodies
chat_template.py  vocabulary (cl100k + Llama-3 specials) and the chat template
prefix.py         chained block hashes for prefix caching
sampling.py       the EOS output-length model and the generated text
tools.py          when a chat request gets a tool call (vLLM), and schema-valid arguments
wire*.py          byte-exact response shapes per personality
metrics*.py       /metrics per personality
routes_sglang.py  SGLang-only endpoints
cli.py            `fleetgate emulate`
"""
