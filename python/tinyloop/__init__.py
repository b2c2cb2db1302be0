"""TinyLoop's Python package: the command line, the servers, the converters and the file
format, around the C++ engine `tinyloop_py` (docs/ARCHITECTURE.md).

The model file, in Python (numpy; the format's declaration is the engine's, so config and
format import `tinyloop_py` when first used, never at import):
- `tinyloop.config`: the model config (fields, defaults and rules from the engine; tensor
  names, presets)
- `tinyloop.format`: read and write `.tinyloop` model files
- `tinyloop.quantize`: int8 / int4 tensor quantization in the file's layout (numpy only)
- `tinyloop.random_model`: random test models (`python3 -m tinyloop.random_model`)
- `tinyloop.convert`: GGUF and Hugging Face import (`convert(src, dst)`; needs the `gguf`
  and `safetensors` packages, imported only when used)

Text, no engine needed:
- `tinyloop.text`: a model's tokenizer, token bytes, grammars, chat templates (docs/text.md);
  `get_tokenizer`, `token_bytes`, `grammar` and `chat_template` are re-exported here
- `tinyloop.conversation`: chat messages -> prompt ids

On the engine (they import `tinyloop_py` when used, never at `import tinyloop`):
- `tinyloop.cli`: the `tinyloop` command (generate, chat, talk, serve, convert, quantize,
  perplexity, bench, inspect); `chat`, `talk`, `perplexity`, `bench`, `quantize_file`,
  `quant_eval` implement its subcommands, `cli_args` holds the options they share and
  `repl` the line loop of chat and talk
- `tinyloop.engine`: an asyncio wrapper of the serving engine
- `tinyloop.server`: the OpenAI-compatible HTTP server (`tinyloop serve`, FastAPI)
- `tinyloop.scale`: replicas on Ray Serve (`tinyloop serve --ray`)

Not here: the numpy float64 reference model, the tests' oracle (tests/python/reference.py),
and the engine's test hooks (`tinyloop_py._testing`).
"""

from .text import chat_template, get_tokenizer, grammar, token_bytes  # stdlib-only imports

__all__ = ["config", "format", "random_model", "get_tokenizer", "token_bytes", "grammar", "chat_template"]
