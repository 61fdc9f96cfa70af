"""The type annotations (unimem/__init__.pyi) against the built package: every public name is declared there
and every declaration is a name of the package; each class's methods and properties are the runtime's; each method's parameters are named as
the runtime's text signature names them; Manager's keywords are the option names; the error classes have
the runtime's bases. A .pyi that drifts from the package fails here."""
import ast
import inspect
import os

import unimem

PYI = os.path.join(os.path.dirname(__file__), "..", "unimem", "__init__.pyi")
DUNDERS = {"__enter__", "__exit__", "__array__", "__dlpack__", "__dlpack_device__", "__init__", "__array_interface__"}


def pyi_tree():
    return ast.parse(open(PYI).read(), PYI)


def declared():
    out = {}
    for node in pyi_tree().body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def members(node):
    """A declared class's methods (name -> FunctionDef) and attributes/properties (names)."""
    methods, attrs = {}, set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                attrs.add(item.name)
            else:
                methods[item.name] = item
        elif isinstance(item, ast.AnnAssign):
            attrs.add(item.target.id)
    return methods, attrs


def params(fn):
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return [n for n in names if n != "self"] + (["*" + a.vararg.arg] if a.vararg else [])


def runtime_params(obj):
    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        out.append("*" + p.name if p.kind is p.VAR_POSITIONAL else p.name)
    return out


def test_every_public_name_is_declared_and_back():
    decl = set(declared())
    public = set(unimem.__all__)
    assert public - decl == set(), "names not declared"
    assert {n for n in decl if not n.startswith("_")} - public == set(), "declarations of names the package lacks"


def test_classes_have_the_runtime_methods_and_properties():
    decl = declared()
    for name in unimem.__all__:
        obj = getattr(unimem, name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException) or name == "Device":
            continue
        methods, attrs = members(decl[name])
        have_m, have_a = set(), set()
        for k, v in vars(obj).items():
            if k.startswith("_") and k not in DUNDERS:
                continue
            if k == "__init__" and not inspect.isfunction(v):
                continue
            if callable(v) and not isinstance(v, property):
                have_m.add(k)
            else:
                have_a.add(k)
        if name in ("Tag", "History"):  # instance attributes of the Python classes
            inst = obj.__new__(obj)
            have_a |= {"name"} if name == "Tag" else {"capacity", "dropped"}
            del inst
        if name == "Access":
            have_m.discard("done")
        if name == "Manager":  # a C type: its keywords are checked against OPTION_NAMES below
            have_m.add("__init__")
        assert set(methods) == have_m, (name, sorted(set(methods) ^ have_m))
        assert attrs == have_a, (name, sorted(attrs ^ have_a))


def test_methods_name_their_parameters_as_the_runtime_does():
    decl = declared()
    checked = 0
    for name in unimem.__all__:
        obj = getattr(unimem, name)
        node = decl[name]
        if isinstance(node, ast.FunctionDef):
            assert params(node) == runtime_params(obj), name
            checked += 1
            continue
        if not inspect.isclass(obj) or issubclass(obj, BaseException) or name in ("Device",):
            continue
        for k, fn in members(node)[0].items():
            if name == "Manager" and k == "__init__":
                continue  # test_manager_takes_the_option_names
            try:
                want = runtime_params(getattr(obj, k))
            except (ValueError, TypeError):  # a C slot without a text signature (__enter__, __exit__)
                continue
            assert params(fn) == want, (name, k, params(fn), want)
            checked += 1
    assert checked >= 40, checked


def test_manager_takes_the_option_names():
    init = members(declared()["Manager"])[0]["__init__"]
    assert [p.arg for p in init.args.kwonlyargs] == list(unimem.OPTION_NAMES)


def test_device_fields_and_error_bases():
    decl = declared()
    fields = [s.target.id for s in decl["Device"].body if isinstance(s, ast.AnnAssign)]
    assert fields == list(unimem.Device.__match_args__)
    for name in unimem.__all__:
        obj = getattr(unimem, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            bases = [b.id for b in decl[name].bases]
            assert bases == [b.__name__ for b in obj.__bases__], (name, bases)


def test_the_package_says_it_is_typed():
    here = os.path.dirname(unimem.__file__)
    assert os.path.exists(os.path.join(here, "py.typed")) and os.path.exists(os.path.join(here, "__init__.pyi"))
