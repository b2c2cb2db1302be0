"""The quickstart of README.md ("Python", its first lines) runs as written against a random model."""
import os

from tinyloop.random_model import write_random_model

QUICKSTART = '''
import numpy as np
import tinyloop_py as tl

with tl.Model("model.tinyloop", max_seq_len=2048) as model:
    prompt = np.array([12, 34, 567], dtype=np.int32)
    tokens = model.generate(prompt, max_tokens=32, loops=8, temperature=0.0, top_k=50)
    print(tokens)
'''


def test_quickstart_runs_as_written(tmp_path, capsys):
    write_random_model(str(tmp_path / "model.tinyloop"), "huginn", vocab_size=1000, max_seq_len=2048)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(QUICKSTART, "quickstart", "exec"), {})
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out.strip()
    tokens = eval(printed)
    assert tokens[:3] == [12, 34, 567] and 4 <= len(tokens) <= 35
    assert all(0 <= t < 1000 for t in tokens)
