"""The torch models: a dense autoencoder (point-wise) and an LSTM-VAE (Minder's temporal
model: a rank's last ``window`` steps, encoded to a latent distribution and decoded back).
Weights travel as named arrays (``to_arrays``); architecture follows from their shapes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn


def _train(net: nn.Module, x: torch.Tensor, epochs: int, lr: float, loss_fn) -> None:  # type: ignore[no-untyped-def]
    optimiser = torch.optim.Adam(net.parameters(), lr=lr)
    batch = 256
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for start in range(0, len(x), batch):
            optimiser.zero_grad()
            loss = loss_fn(x[order[start : start + batch]])
            loss.backward()
            optimiser.step()


def _arrays(net: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def _load(net: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()})


class _Dense(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.enc = nn.Sequential(
            nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, hidden)
        )
        self.dec = nn.Sequential(nn.Tanh(), nn.Linear(hidden, width))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dec(self.enc(z))
        return out


class AutoencoderModel:
    """A small dense autoencoder; score = squared reconstruction error of the last step."""

    kind, window = "autoencoder", 1

    def __init__(self, hidden: int = 3, epochs: int = 60, lr: float = 0.01, seed: int = 0) -> None:
        self.hidden, self.epochs, self.lr, self.seed = hidden, epochs, lr, seed
        self.net_: _Dense | None = None

    def fit(self, x: np.ndarray) -> AutoencoderModel:
        torch.manual_seed(self.seed)
        z = torch.as_tensor(x[:, -1], dtype=torch.float32)
        width = z.shape[1]
        self.net_ = _Dense(width, max(1, min(self.hidden, width - 1)))
        net = self.net_
        _train(net, z, self.epochs, self.lr, lambda b: ((net(b) - b) ** 2).mean())
        return self

    def contributions(self, x: np.ndarray) -> np.ndarray:
        assert self.net_ is not None, "fit the model first"
        with torch.no_grad():
            z = torch.as_tensor(x[:, -1], dtype=torch.float32)
            out: np.ndarray = ((self.net_(z) - z) ** 2).numpy().astype(float)
        return out

    def score(self, x: np.ndarray) -> np.ndarray:
        total: np.ndarray = self.contributions(x).sum(axis=1)
        return total

    def to_arrays(self) -> dict[str, np.ndarray]:
        assert self.net_ is not None, "fit the model first"
        return _arrays(self.net_)

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> AutoencoderModel:
        width = int(np.asarray(a["enc.0.weight"]).shape[1])
        hidden = int(np.asarray(a["enc.2.weight"]).shape[0])
        model = cls(hidden=hidden)
        model.net_ = _Dense(width, hidden)
        _load(model.net_, a)
        return model


class _LSTMVAE(nn.Module):
    def __init__(self, width: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.encoder = nn.LSTM(width, hidden, batch_first=True)
        self.mu = nn.Linear(hidden, latent)
        self.logvar = nn.Linear(hidden, latent)
        self.decoder = nn.LSTM(latent, hidden, batch_first=True)
        self.out = nn.Linear(hidden, width)

    def forward(
        self, x: torch.Tensor, sample: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _, (h, _) = self.encoder(x)
        mu, logvar = self.mu(h[-1]), self.logvar(h[-1])
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if sample else mu
        steps = z.unsqueeze(1).expand(-1, x.shape[1], -1)
        decoded, _ = self.decoder(steps)
        return self.out(decoded), mu, logvar


class LSTMVAEModel:
    """An LSTM variational autoencoder over each rank's last ``window`` steps (Minder);
    score = squared reconstruction error of the last step from the latent mean."""

    kind = "lstm_vae"

    def __init__(
        self,
        window: int = 8,
        hidden: int = 16,
        latent: int = 4,
        epochs: int = 20,
        lr: float = 0.005,
        beta: float = 0.1,
        seed: int = 0,
    ) -> None:
        self.window, self.hidden, self.latent = window, hidden, latent
        self.epochs, self.lr, self.beta, self.seed = epochs, lr, beta, seed
        self.net_: _LSTMVAE | None = None

    def fit(self, x: np.ndarray) -> LSTMVAEModel:
        torch.manual_seed(self.seed)
        seq = torch.as_tensor(x, dtype=torch.float32)
        self.net_ = _LSTMVAE(seq.shape[2], self.hidden, self.latent)
        net, beta = self.net_, self.beta

        def loss(b: torch.Tensor) -> torch.Tensor:
            back, mu, logvar = net(b, sample=True)
            kl = -0.5 * torch.mean(1 + logvar - mu**2 - logvar.exp())
            total: torch.Tensor = ((back - b) ** 2).mean() + beta * kl
            return total

        _train(net, seq, self.epochs, self.lr, loss)
        return self

    def contributions(self, x: np.ndarray) -> np.ndarray:
        assert self.net_ is not None, "fit the model first"
        with torch.no_grad():
            seq = torch.as_tensor(x, dtype=torch.float32)
            back, _, _ = self.net_(seq, sample=False)
            out: np.ndarray = ((back[:, -1] - seq[:, -1]) ** 2).numpy().astype(float)
        return out

    def score(self, x: np.ndarray) -> np.ndarray:
        total: np.ndarray = self.contributions(x).sum(axis=1)
        return total

    def to_arrays(self) -> dict[str, np.ndarray]:
        assert self.net_ is not None, "fit the model first"
        return {**_arrays(self.net_), "window": np.array([self.window])}

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> LSTMVAEModel:
        weights = {k: v for k, v in a.items() if k != "window"}
        width = int(np.asarray(weights["encoder.weight_ih_l0"]).shape[1])
        hidden = int(np.asarray(weights["encoder.weight_hh_l0"]).shape[1])
        latent = int(np.asarray(weights["mu.weight"]).shape[0])
        model = cls(window=int(np.asarray(a["window"])[0]), hidden=hidden, latent=latent)
        model.net_ = _LSTMVAE(width, hidden, latent)
        _load(model.net_, weights)
        return model
