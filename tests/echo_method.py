"""A method without a model for tests about orchestration: its answer is the question upper-cased.
A question ``fail-while:PATH`` fails its query while the file PATH exists (a failure a resume retries)."""
import os

from specrag.methods import Method


class Echo(Method):
    name = "echo-test"
    needs = {}

    def stages(self):
        return [_Echo()]


class _Echo:
    name = "Echo"

    async def run(self, item, ctx):
        question = item.query["question"]
        if question.startswith("fail-while:") and os.path.exists(question.split(":", 1)[1]):
            raise RuntimeError(f"failing while {question.split(':', 1)[1]} exists")
        item.answer = item.query["question"].upper()
        return item
