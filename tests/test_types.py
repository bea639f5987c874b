"""Type hints on the public API: every public function and method of the modules a program calls into (the cache
protocol, attention, the forward pass, the model, the pool, the engines, a trace, speculative decoding) says what it
takes and what it returns. The checker reads the signatures, so a function added without hints fails here."""
import importlib
import inspect

import pytest

TYPED = ["kvlesson.atomic", "kvlesson.cache", "kvlesson.sdpa", "kvlesson.layer", "kvlesson.model", "kvlesson.llama",
         "kvlesson.online", "kvlesson.rope", "kvlesson.speculative", "kvlesson.serving.paged",
         "kvlesson.serving.forward", "kvlesson.serving.batch", "kvlesson.serving.engine", "kvlesson.serving.trace",
         "kvlesson.sample", "kvlesson.serving.grammar", "kvlesson.serving.stream", "kvlesson.serving.loop",
         "kvlesson.serving.openai_api", "kvlesson.serving.server"]


def public(module):
    """(name, function) of every public function of the module, and every public method of its public classes."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member) and member.__module__ == module.__name__ and (
                        not attr.startswith("_") or attr == "__init__"):
                    yield f"{name}.{attr}", member


def missing(function):
    """-> the parameters (and 'return') of `function` that carry no annotation; self and cls need none."""
    sig = inspect.signature(function)
    gaps = [p for p in sig.parameters if p not in ("self", "cls") and sig.parameters[p].annotation is sig.empty
            and sig.parameters[p].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if sig.return_annotation is sig.empty and function.__name__ != "__init__":
        gaps.append("return")
    return gaps


@pytest.mark.parametrize("name", TYPED)
def test_every_public_function_says_what_it_takes_and_returns(name):
    module = importlib.import_module(name)
    gaps = {f: m for f, function in public(module) if (m := missing(function))}
    assert not gaps, f"{name}: unannotated {gaps}"


def test_the_checker_sees_a_missing_hint():
    def typed(x: int) -> int:
        return x

    def untyped(x, y: int):
        return x

    assert missing(typed) == [] and missing(untyped) == ["x", "return"]
