"""Compress-and-Route's pure side (FleetOpt §5): content category, exact token counts,
extractive compression. No I/O, no clock.

What the gateway calls (see each module's docstring):
- `compressor.content.classify(prompt, messages)` → Category, on every request;
- `compressor.compress.fit_request(target, prompt=…/messages=…, may_compress=…,
  likely_fits=…)` → Compression, when a placement carries `compress_to`;
- `compressor.compress.request_tokens(prompt=…/messages=…)` → the engine's exact count.

Modules, one idea each: template (what a prompt costs the engine), counting (exact
memoised cl100k counts), fences and sentences (units), document (units' tokens and
terms), scoring, select, exact (the count of a selection), compress (the entry points).
"""
