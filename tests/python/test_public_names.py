"""The public `tinyloop_py` namespace holds only the API: no name there, nor on any class it
exports, starts with "_" (dunder methods aside). Test and benchmark hooks live in the
private submodule `tinyloop_py._testing`, as functions taking the model (or grammar) first."""
import importlib

import pytest

import tinyloop_py as tl

# pybind11 adds this method to every class it binds (its cross-module conduit); it is the
# binding library's, not ours.
PYBIND11_INTERNAL = {"_pybind11_conduit_v1_"}

HOOKS = {"stepwise_logits", "early_exit_stepwise_logits", "beam_search_core", "beam_search_memory",
         "sampling_distribution", "sample_next", "time_mask_steps", "machine_bounds"}


def private_names(obj) -> list[str]:
    """Names of obj starting with "_" that are neither dunder nor pybind11's own."""
    return sorted(n for n in dir(obj)
                  if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
                  and n not in PYBIND11_INTERNAL)


def exported_classes():
    return sorted(n for n in dir(tl) if not n.startswith("_") and isinstance(getattr(tl, n), type))


def test_private_names_finds_a_single_underscore_name():
    class Probe:
        def _hook(self):
            pass

        def __repr__(self):
            return "Probe"

    assert private_names(Probe) == ["_hook"]


def test_the_module_namespace_has_only_the_testing_submodule_private():
    assert private_names(tl) == ["_testing"]


def test_the_module_exports_the_classes_to_check():
    assert {"Model", "Engine", "Grammar", "PrefixPool", "SamplingParams"} <= set(exported_classes())


@pytest.mark.parametrize("name", exported_classes())
def test_no_exported_class_has_private_attributes(name):
    assert private_names(getattr(tl, name)) == [], name


def test_the_hooks_live_in_the_testing_submodule():
    testing = importlib.import_module("tinyloop_py._testing")
    assert testing is tl._testing
    assert {n for n in dir(testing) if not n.startswith("__")} == HOOKS
    for name in HOOKS:
        assert not hasattr(tl, name) and not hasattr(tl, "_" + name), name
        assert not hasattr(tl.Model, "_" + name), name
