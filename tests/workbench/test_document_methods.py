"""No serialization method that only restates its dataclass's fields: the encoder (workbench/document.py)
writes a dataclass as its fields and `decode` reads a flat one back, so an ``as_dict``/``to_dict``/``to_json``/
``document`` that returns ``asdict(self)`` or ``{"f": self.f, ...}`` for exactly its fields, or a ``from_dict``
that is ``cls(**d)`` or ``cls(f=d["f"], ...)``, is a second copy of what the encoder does. The one allowed
restatement is a top-level result's document, which adds ``"schema": SCHEMA``; it goes through the encoder
(``document.encode_fields``), not ``asdict``. Read from the source (AST) of all of src/wavefront."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "wavefront"
TO = ("as_dict", "to_dict", "to_json", "document")
FROM = ("from_dict",)
#: Calls that only re-type a field's value, which the encoder does itself (tuple -> list, Path -> str, a
#: dataclass -> its fields, nested documents -> theirs).
PLAIN = {"encode", "encode_fields", "list", "tuple", "dict", "str", "asdict", "vars"}


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def _unwrap(node: ast.AST) -> ast.AST:
    """``json.loads(json.dumps(x))`` and ``encode(x)`` -> ``x``."""
    while _call_name(node) in ("loads", "dumps", "encode") and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    return node


def _is_self_field(node: ast.AST, name: str | None = None) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and (name is None or node.attr == name))


def _plain_view(value: ast.AST, key: str) -> bool:
    """`value` is field `key` of self, at most re-typed (PLAIN) or mapped element-wise to its document."""
    value = _unwrap(value)
    if _call_name(value) in PLAIN and len(value.args) == 1:
        value = value.args[0]
    if isinstance(value, ast.ListComp) and len(value.generators) == 1:
        gen, elt = value.generators[0], value.elt
        target = gen.target.id if isinstance(gen.target, ast.Name) else None
        inner = elt.args[0] if _call_name(elt) in PLAIN and len(elt.args) == 1 else elt
        if _call_name(elt) == "as_dict" and isinstance(elt.func, ast.Attribute):
            inner = elt.func.value
        return _is_self_field(gen.iter, key) and isinstance(inner, ast.Name) and inner.id == target
    return _is_self_field(value, key)


def _returns(fn: ast.FunctionDef) -> ast.AST | None:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None


def _is_asdict_self(node: ast.AST) -> bool:
    node = _unwrap(node)
    return (_call_name(node) in ("asdict", "encode_fields", "vars") and len(node.args) == 1
            and isinstance(node.args[0], ast.Name) and node.args[0].id == "self")


def _patches_asdict(fn: ast.FunctionDef, fields: list[str]) -> bool:
    """``d = asdict(self); d["f"] = encode(self.f); ...; return d``: every patched key a field, re-typed."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) < 2 or not (isinstance(body[0], ast.Assign) and _is_asdict_self(body[0].value)
                             and isinstance(body[0].targets[0], ast.Name)):
        return False
    name = body[0].targets[0].id
    ret = body[-1]
    if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name) and ret.value.id == name):
        return False
    for st in body[1:-1]:
        t = st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else None
        if not (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
                and isinstance(t.slice, ast.Constant) and t.slice.value in fields
                and _plain_view(st.value, t.slice.value)):
            return False
    return True


def _restates_to(fn: ast.FunctionDef, fields: list[str]) -> str | None:
    """Why `fn` (a TO method) only restates `fields`, or None. A ``"schema"`` key makes it a top-level
    document: allowed, unless it reaches its fields through ``asdict`` instead of the encoder."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "schema" for k in node.keys):
            if any(_call_name(n) == "asdict" for n in ast.walk(fn)):
                return "a document with SCHEMA built with asdict: use encode / document.encode_fields(self)"
            return None
    if any(_call_name(n) == "asdict" and n.args and _call_name(n.args[0]) == "replace" for n in ast.walk(fn)):
        return "asdict(replace(self, ...)) with the left-out fields rebuilt by hand: the encoder writes them all"
    if _patches_asdict(fn, fields):
        return "asdict(self) with fields re-encoded in place: the encoder does both"
    ret = _returns(fn)
    if ret is None:
        return None
    ret = _unwrap(ret)
    if _is_asdict_self(ret):
        return "returns asdict(self)"
    if not isinstance(ret, ast.Dict):
        return None
    keys = [k.value for k in ret.keys if isinstance(k, ast.Constant)]
    spread = [v for k, v in zip(ret.keys, ret.values, strict=True) if k is None]
    if spread:
        return "returns asdict(self) with nothing added" if all(_is_asdict_self(s) for s in spread) and not keys \
            else None
    restated = {k.value for k, v in zip(ret.keys, ret.values, strict=True)
                if isinstance(k, ast.Constant) and _plain_view(v, k.value)}
    if fields and restated == set(keys) == set(fields):
        return f"returns exactly its fields {sorted(fields)}"
    return None


def _restates_from(fn: ast.FunctionDef, fields: list[str]) -> str | None:
    ret = _returns(fn)
    if ret is None or not isinstance(ret, ast.Call):
        return None
    arg = fn.args.args[1].arg if len(fn.args.args) > 1 else None
    if _call_name(ret) == "decode":
        return "returns decode(cls, d): call decode at the call site"
    if not (isinstance(ret.func, ast.Name) and ret.func.id == "cls"):
        return None
    if not ret.args and len(ret.keywords) == 1 and ret.keywords[0].arg is None:
        return "returns cls(**d)"
    kw = {k.arg: k.value for k in ret.keywords if k.arg is not None}

    def plain(v: ast.AST, key: str) -> bool:
        if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name) and v.value.id == arg:
            return isinstance(v.slice, ast.Constant) and v.slice.value == key
        return (_call_name(v) == "get" and isinstance(v.func.value, ast.Name) and v.func.value.id == arg
                and isinstance(v.args[0], ast.Constant) and v.args[0].value == key)

    if not ret.args and fields and set(kw) == set(fields) and all(plain(v, k) for k, v in kw.items()):
        return f"returns cls(f=d['f'], ...) for exactly its fields {sorted(fields)}"
    return None


def _dataclass_fields(cls: ast.ClassDef) -> list[str]:
    is_dc = any("dataclass" in ast.unparse(d) for d in cls.decorator_list)
    return [s.target.id for s in cls.body if is_dc and isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            and "ClassVar" not in ast.unparse(s.annotation)]


def restatements(tree: ast.AST) -> list[tuple[str, str]]:
    """(Class.method, why) for every serialization method in `tree` that only restates its fields."""
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        fields = _dataclass_fields(cls)
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            why = (_restates_to(fn, fields) if fn.name in TO else
                   _restates_from(fn, fields) if fn.name in FROM else None)
            if why:
                out.append((f"{cls.name}.{fn.name}", why))
    return out


PLANTED = '''
@dataclass
class A:
    x: int
    y: tuple
    def as_dict(self):
        return asdict(self)
@dataclass
class B:
    x: int
    y: list
    def to_dict(self):
        """doc"""
        return {"x": self.x, "y": [v.as_dict() for v in self.y]}
    @classmethod
    def from_dict(cls, d):
        return cls(x=d["x"], y=d.get("y", []))
@dataclass
class C:
    x: int
    def as_dict(self):
        return {"x": self.x, "twice": 2 * self.x}
    @classmethod
    def from_dict(cls, d):
        return cls(**d)
@dataclass
class D:
    x: int
    def as_dict(self):
        return {"schema": SCHEMA, **asdict(self)}
@dataclass
class E:
    x: int
    def as_dict(self):
        return {"schema": SCHEMA, **encode_fields(self)}
@dataclass
class G:
    x: list
    def as_dict(self):
        n = len(self.x)
        return {"schema": SCHEMA, "n": n, "x": [asdict(v) for v in self.x]}
@dataclass
class H:
    x: int
    y: object
    def as_dict(self):
        d = asdict(self)
        d["y"] = encode(self.y)
        return d
    def to_json(self):
        d = asdict(self)
        d["ok"] = self.x > 0
        return d
@dataclass
class K:
    x: int
    steps: list
    def as_dict(self):
        return asdict(replace(self, steps=[])) | {"steps": [{"a": s.a} for s in self.steps]}
@dataclass
class F:
    x: int
    def as_dict(self):
        return json.loads(json.dumps(asdict(self)))
'''


def test_the_finder_finds_planted_restatements_and_passes_computed_ones():
    found = dict(restatements(ast.parse(PLANTED)))
    assert set(found) == {"A.as_dict", "B.to_dict", "B.from_dict", "C.from_dict", "D.as_dict", "F.as_dict",
                          "G.as_dict", "H.as_dict", "K.as_dict"}, found


def test_no_serialization_method_only_restates_its_fields():
    found = [f"{p.relative_to(SRC)}: {name}: {why}" for p in sorted(SRC.rglob("*.py"))
             for name, why in restatements(ast.parse(p.read_text()))]
    assert found == [], ("the encoder (workbench/document.py: encode, decode, encode_fields) does this; drop the "
                         "method and encode at the edge:\n" + "\n".join(found))
