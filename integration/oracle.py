"""The float32 oracle both backends are compared to: the same checkpoint in HF transformers, float32, on the CPU,
teacher-forced on the exact token ids a server saw.

``oracle_logprobs(model_dir, queries)`` runs this file as a subprocess (the torchvision work-around in the CPU
shims must load at interpreter start, see ``demo.cpu_host``). Each query is
``{"ids": [...], "positions": [p, ...], "tokens": [[t, ...], ...]}``: one forward pass over ``ids``, and for each
position ``p`` (the index in ``ids`` of the token being predicted, so its logits come from ``ids[:p]``) the float32
log-probability of each listed token. The answer is one ``{token: logprob}`` dict per position.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def oracle_logprobs(model_dir: Path | str, queries: list[dict], timeout_s: float = 900.0) -> list[list[dict[int, float]]]:
    from demo.cpu_host import cpu_env  # the caller's (this file's subprocess runs without the checkout on its path)

    with tempfile.TemporaryDirectory(prefix="inkling-oracle-") as tmp:
        request, answer = Path(tmp) / "queries.json", Path(tmp) / "answer.json"
        request.write_text(json.dumps(queries))
        proc = subprocess.run([sys.executable, __file__, str(model_dir), str(request), str(answer)], env=cpu_env(),
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"float32 oracle failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
        raw = json.loads(answer.read_text())
    return [[{int(t): lp for t, lp in position.items()} for position in seq] for seq in raw]


def _run(model_dir: str, request: Path, answer: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for query in json.loads(request.read_text()):
            ids = torch.tensor([query["ids"]], dtype=torch.long)
            rows = torch.tensor([p - 1 for p in query["positions"]], dtype=torch.long)
            # Only the scored positions' logits, log-softmaxed in float64 (the full [tokens, vocab] would be GBs).
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, rows].double(), dim=-1)
            out.append([{str(t): logprobs[i, t].item() for t in tokens}
                        for i, tokens in enumerate(query["tokens"])])
    answer.write_text(json.dumps(out))


if __name__ == "__main__":
    _run(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
