"""A method without a model for tests about orchestration: its answer is the question upper-cased."""
from specrag.methods import Method


class Echo(Method):
    name = "echo-test"
    needs = {}

    def stages(self):
        return [_Echo()]


class _Echo:
    name = "Echo"

    async def run(self, item, ctx):
        item.answer = item.query["question"].upper()
        return item
