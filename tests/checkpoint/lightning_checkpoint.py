"""Writes a checkpoint as Lightning 2.6 does, for fulgur to read its weights (tests/checkpoint/lightning_tests.cpp).

A LightningModule holding its network as self.model = Sequential(Linear(4, 8), ReLU, Linear(8, 3)),
with hyperparameters (self.save_hyperparameters(): numbers and a string, and Python objects as real
configurations have them: a pathlib.Path, an Enum member, an argparse.Namespace, a torch.dtype,
Lightning's AttributeDict), trained 2 steps by lightning.Trainer with ModelCheckpoint and EarlyStopping
(callback states, a momentum SGD's state), then Trainer.save_checkpoint(<checkpoint>): Lightning's own
pickle, which holds those objects as pickled Python classes besides the tensors.

Also writes <expected>: for each key of the module's state_dict, in order, one line
"<key> <dtype> <dim0>x<dim1>... <hex of the tensor's bytes, little-endian, contiguous>", the weights the
C++ test compares bit for bit.

usage: lightning_checkpoint.py <checkpoint .ckpt> <expected .txt>
"""
import argparse
import enum
import os
import pathlib
import sys
import tempfile
import warnings

import torch
from torch import nn

import lightning
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

warnings.filterwarnings("ignore")


class Activation(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class Regressor(lightning.LightningModule):
    def __init__(self, hidden: int = 8, lr: float = 0.1, name: str = "tiny", data_dir: pathlib.Path = pathlib.Path("."),
                 activation: Activation = Activation.RELU, config: argparse.Namespace = None,
                 dtype: torch.dtype = torch.float32, extra: AttributeDict = None):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    checkpoint_path, expected_path = sys.argv[1], sys.argv[2]
    lightning.seed_everything(7, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 3))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    module = Regressor(hidden=8, lr=0.1, name="tiny", data_dir=pathlib.Path("/data/tiny"), activation=Activation.TANH,
                       config=argparse.Namespace(seed=7, layers=[4, 8, 3]), dtype=torch.float32,
                       extra=AttributeDict(note="kept", scale=2.5))
    with tempfile.TemporaryDirectory() as root:
        trainer = lightning.Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                                    accelerator="cpu", devices=1, default_root_dir=root,
                                    callbacks=[ModelCheckpoint(dirpath=os.path.join(root, "checkpoints")),
                                               EarlyStopping(monitor="train_loss", patience=5)])
        trainer.fit(module, loader)
        trainer.save_checkpoint(checkpoint_path)
    state = module.state_dict()
    assert list(state) == ["model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"], list(state)
    with open(expected_path, "w") as out:
        for key, tensor in state.items():
            t = tensor.detach().cpu().contiguous()
            shape = "x".join(str(d) for d in t.shape)
            out.write(f"{key} {str(t.dtype).removeprefix('torch.')} {shape} {t.numpy().tobytes().hex()}\n")
    print(f"lightning {lightning.__version__} wrote {checkpoint_path}: {len(state)} tensors, "
          f"global_step {trainer.global_step}")


if __name__ == "__main__":
    main()
