"""Worker for tests/test_readme_snippets.py: runs one of the README's code blocks as written, after a prelude that
defines what the block leaves to the reader (the model, the data, the loss, the budget). Usage:
readme_snippet.py torch|keras OUT_DIR; rank 0 writes OUT_DIR/snippet.json with the final loss-free check values."""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADINGS = {"torch": "## PyTorch in 10 lines", "keras": "## Keras 3 (TensorFlow >= 2.16) in 10 lines"}


def snippet(kind: str) -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index(HEADINGS[kind]):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def torch_prelude():
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 2, generator=g)

    def gen():
        while True:
            x = torch.randn(16, 8, generator=g)
            yield x, (x @ w).argmax(1)
    return {"torch": torch, "model": model, "batches": gen(), "loss_fn": torch.nn.functional.cross_entropy,
            "total_steps": 80}


def keras_prelude():
    import numpy as np
    import keras
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 2))).argmax(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    return {"keras": keras, "model": model, "x": x, "y": y}


def main():
    kind, out_dir = sys.argv[1], sys.argv[2]
    scope = torch_prelude() if kind == "torch" else keras_prelude()
    exec(compile(snippet(kind), f"README.md ({kind} snippet)", "exec"), scope)
    model = scope["model"]
    if kind == "torch":
        import horovod.torch as hvd
        weights = [p.detach().numpy().ravel().tolist() for p in model.parameters()]
    else:
        import horovod.tensorflow as hvd
        weights = [v.numpy().ravel().tolist() for v in model.trainable_variables]
    everyone = hvd.allgather_object(weights, name="snippet.weights")
    if hvd.rank() == 0:
        with open(os.path.join(out_dir, "snippet.json"), "w") as f:
            json.dump({"identical": all(w == everyone[0] for w in everyone), "ranks": len(everyone)}, f)


if __name__ == "__main__":
    main()
