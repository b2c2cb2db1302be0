"""TinyLoop's pure-Python package (numpy only at run time).

- `tinyloop.config`: the model config (defaults, consistency rules, tensor names, presets)
- `tinyloop.format`: read and write `.tinyloop` model files
- `tinyloop.reference`: the float64 numpy reference forward and generation loop
- `tinyloop.random_model`: random test models (`python3 -m tinyloop.random_model`)
- `tinyloop.convert`: GGUF and Hugging Face import (`convert(src, dst)`; needs the `gguf`
  and `safetensors` packages, imported only when used)
- `tinyloop.text`: a model's tokenizer, token bytes, grammars, chat templates (docs/text.md);
  `get_tokenizer`, `token_bytes`, `grammar` and `chat_template` are re-exported here

The C++ engine is the separate extension module `tinyloop_py`; this package does not
import it, so everything here works without a build.
"""

from .text import chat_template, get_tokenizer, grammar, token_bytes  # stdlib-only imports

__all__ = ["config", "format", "reference", "random_model", "get_tokenizer", "token_bytes", "grammar",
           "chat_template"]
