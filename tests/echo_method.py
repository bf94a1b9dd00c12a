"""A method without a model for tests about orchestration: its answer is the question upper-cased.
A question ``fail-while:PATH`` fails its query while the file PATH exists (a failure a resume retries);
``wait-while:PATH`` holds its query while PATH exists (a run to kill while it writes)."""
import asyncio
import os

from specrag.methods import Method, Stage


class Echo(Method):
    name = "echo-test"
    needs = {}

    def stages(self):
        return [_Echo()]


class _Echo(Stage):
    name = "Echo"

    async def run(self, item, ctx):
        question = item.query["question"]
        if question.startswith("fail-while:") and os.path.exists(question.split(":", 1)[1]):
            raise RuntimeError(f"failing while {question.split(':', 1)[1]} exists")
        while question.startswith("wait-while:") and os.path.exists(question.split(":", 1)[1]):
            await asyncio.sleep(0.05)
        item.answer = item.query["question"].upper()
        return item
