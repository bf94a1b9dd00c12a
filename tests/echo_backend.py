"""A model backend that exists only in the tests: every generation is the reply its flag gives,
every continuation scores one log-probability per word (closed-set options: the shortest wins).

It is what a user's own backend is: this module and one registry line
(``registry.BACKENDS.targets["echo"] = "echo_backend:EchoBackend"``), nothing else. Its flag
(``--echo-reply``), its start-up check (an empty reply is refused), its identity (the reply
decides the results) and its fallback (encoders run on the local backend) are its own traits,
declared on the class as ``ModelBackend`` asks."""
from __future__ import annotations

from dataclasses import dataclass

from specrag.inference.capabilities import GENERATE, SCORE
from specrag.inference.engine import BackendSettings, ModelBackend
from specrag.inference.models import model_spec
from specrag.inference.types import GenerateRequest, Generation, ScoreRequest, Scored


@dataclass(frozen=True)
class EchoConfig:
    reply: str = "echo"


class EchoBackend(ModelBackend):
    fallback = "local"  # its run's encoders (a dense retriever's) run in the worker
    takes_dtype = False

    @classmethod
    def add_options(cls, flag) -> None:
        flag("reply", default="echo", help="what every generation of the echo backend says")

    @classmethod
    def config_from_options(cls, value, chosen: bool) -> EchoConfig | None:
        if not chosen:
            if value("reply") != "echo":
                raise ValueError("--echo-reply is an option of --backend echo")
            return None
        return EchoConfig(value("reply"))

    @classmethod
    def serves(cls, model: str, settings: BackendSettings | None = None) -> frozenset[str]:
        return frozenset({GENERATE, SCORE}) if model_spec(model).kind == "causal-lm" else frozenset()

    @classmethod
    def check_run(cls, settings: BackendSettings, needs) -> None:
        if not (settings.config_of(EchoConfig) or EchoConfig()).reply.strip():
            raise ValueError("--echo-reply must say something")

    @classmethod
    def model_identity(cls, model: str) -> str:
        return f"echo:{model}"

    @classmethod
    def identity_extras(cls, settings: BackendSettings) -> dict:
        return {"echo_reply": (settings.config_of(EchoConfig) or EchoConfig()).reply}

    @classmethod
    def open(cls, model: str, settings: BackendSettings) -> "EchoBackend":
        return cls(model, settings.config_of(EchoConfig) or EchoConfig())

    def __init__(self, model: str, config: EchoConfig):
        self.name, self.config = model, config
        self.capabilities = self.serves(model)

    def generate(self, requests: list[GenerateRequest]) -> list[Generation]:
        words = self.config.reply.split()
        return [Generation(" ".join(words[:r.max_new_tokens]), list(range(min(len(words), r.max_new_tokens))),
                           [0.0] * min(len(words), r.max_new_tokens), len(r.prompt.split()), "stop")
                for r in requests]

    def score(self, requests: list[ScoreRequest]) -> list[Scored]:
        return [Scored([-1.0] * len(r.continuation.split()), len(r.prompt.split())) for r in requests]
