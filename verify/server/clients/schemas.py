# SPDX-License-Identifier: Apache-2.0
"""Seeded random JSON schemas of the subset Tessera's grammar compiles, and a small validator for them
written from the JSON Schema definitions (independent of the server): type (and lists), enum, const, anyOf,
oneOf (exactly one), allOf, $ref into $defs, properties / required / additionalProperties, items,
minItems / maxItems, minLength / maxLength (code points), minimum / maximum / exclusive bounds.
"""
import math
import random

KEYS = ["a", "b", "name", "id", "value", "x y", "ключ", "中文", "emoji😀", "unit", "z9", "n"]
STRINGS = ["", "a", "ab", "celsius", "q\"", "über", "中文", "😀", "1", " spaced "]


class SchemaGen:
    def __init__(self, rng: random.Random, dsml_keys=False):
        self.rng = rng
        self.dsml_keys = dsml_keys  # tool parameters: keys DSML can carry (no '"')
        self.defs = {}

    def key(self):
        if not self.dsml_keys and self.rng.random() < 0.08:
            return "q\"uote"
        return self.rng.choice(KEYS)

    def literal(self, depth=1):
        k = self.rng.randrange(7 if depth > 0 else 5)
        if k in (0, 1):
            return self.rng.choice(STRINGS)
        if k == 2:
            return self.rng.choice([0, 1, -1, 12, 123, -40, 100000])
        if k == 3:
            return self.rng.choice([1.5, -0.25, 2.0, 3.125e-5])
        if k == 4:
            return self.rng.choice([True, False, None])
        if k == 5:
            return [self.literal(depth - 1) for _ in range(self.rng.randrange(3))]
        return {self.key(): self.literal(depth - 1) for _ in range(self.rng.randrange(3))}

    def leaf(self):
        r = self.rng
        k = r.randrange(11)
        if k in (0, 1):
            s = {"type": "string"}
            if r.random() < 0.5:
                s["minLength"] = r.randrange(4)
                if r.random() < 0.6:
                    s["maxLength"] = s["minLength"] + r.randrange(7)
            return s
        if k == 2:
            s = {"type": "integer"}
            lo = r.randrange(-1000, 1000)
            m = r.randrange(5)
            if m == 1:
                s["minimum"] = lo
            elif m == 2:
                s.update(minimum=lo, maximum=lo + r.randrange(30))
            elif m == 3:
                s.update(exclusiveMinimum=lo, exclusiveMaximum=lo + 2 + r.randrange(5))
            elif m == 4:
                s["maximum"] = lo
            return s
        if k == 3:
            s = {"type": "number"}
            lo = r.randrange(-2000, 2000) / 8
            m = r.randrange(4)
            if m == 1:
                s["minimum"] = lo
            elif m == 2:
                s.update(minimum=lo, maximum=lo + r.randrange(100) / 16 + 0.001)
            elif m == 3:
                s.update(exclusiveMinimum=lo, exclusiveMaximum=lo + 0.0625 * (1 + r.randrange(4)))
            return s
        if k == 4:
            return {"type": "boolean"}
        if k == 5:
            return {"type": "null"}
        if k == 6:
            return {"type": ["string", "null"], "maxLength": r.randrange(1, 6)}
        if k == 7:
            return {"enum": [self.literal() for _ in range(1 + r.randrange(4))]}
        if k == 8:
            return {"const": self.literal()}
        if k == 9:
            return {"type": "string", "enum": ["x", "xy", "xyz", "y"]}
        return {}

    def declared_object(self, depth):
        r = self.rng
        props = {self.key(): self.schema(depth - 1) for _ in range(r.randrange(5))}
        s = {"type": "object", "properties": props}
        req = [k for k in props if r.random() < 0.45]
        if req:
            s["required"] = req
        ap = r.randrange(4)
        if ap == 1:
            s["additionalProperties"] = False
        elif ap == 2:
            s["additionalProperties"] = True
        return s

    def schema(self, depth):
        r = self.rng
        if depth <= 0:
            return self.leaf()
        k = r.randrange(10)
        if k in (0, 1, 2):
            return self.declared_object(depth)
        if k == 3:
            s = {"type": "object"}
            if r.random() < 0.6:
                s["additionalProperties"] = self.leaf()
            return s
        if k in (4, 5):
            s = {"type": "array", "items": self.schema(depth - 1)}
            if r.random() < 0.5:
                s["minItems"] = r.randrange(3)
                if r.random() < 0.6:
                    s["maxItems"] = s["minItems"] + r.randrange(4)
            return s
        if k == 6:
            return {"anyOf": [self.schema(depth - 1) for _ in range(2 + r.randrange(2))]}
        if k == 7:
            types = ["string", "integer", "boolean", "null", "object"]
            r.shuffle(types)
            return {"oneOf": [{"type": t} for t in types[:2 + r.randrange(2)]]}
        if k == 8:
            name = f"d{len(self.defs)}"
            self.defs[name] = {"type": "object",
                               "properties": {"v": self.leaf(), "next": {"$ref": f"#/$defs/{name}"}},
                               "required": ["v"]}
            return {"$ref": f"#/$defs/{name}"}
        return self.leaf()

    def root(self, depth):
        self.defs = {}
        s = self.schema(depth)
        if self.defs:
            s["$defs"] = dict(self.defs)
        return s

    def object_root(self, depth):
        self.defs = {}
        s = self.declared_object(depth)
        if self.defs:
            s["$defs"] = dict(self.defs)
        return s


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _equal(a, b):
    if _num(a) and _num(b):
        return a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


def _has_type(v, t):
    return {"null": v is None, "boolean": isinstance(v, bool), "string": isinstance(v, str),
            "array": isinstance(v, list), "object": isinstance(v, dict), "number": _num(v),
            "integer": _num(v) and float(v).is_integer()}.get(t, False)


def validate(v, schema, root=None, at="$"):
    """'' when `v` satisfies `schema`, else the first violation."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return ""
    if schema is False:
        return at + ": schema false"
    if "$ref" in schema:
        ref = schema["$ref"]
        target = root if ref == "#" else root.get("$defs", {}).get(ref.split("/")[-1])
        return validate(v, target, root, at) if target is not None else at + ": bad $ref"
    if "const" in schema and not _equal(v, schema["const"]):
        return at + ": const mismatch"
    if "enum" in schema and not any(_equal(v, x) for x in schema["enum"]):
        return at + ": not in enum"
    if "anyOf" in schema and not any(validate(v, s, root, at) == "" for s in schema["anyOf"]):
        return at + ": no anyOf alternative"
    if "oneOf" in schema and sum(validate(v, s, root, at) == "" for s in schema["oneOf"]) != 1:
        return at + ": not exactly one oneOf alternative"
    for s in schema.get("allOf", []):
        e = validate(v, s, root, at)
        if e:
            return e
    if "type" in schema:
        ts = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_has_type(v, t) for t in ts):
            return at + f": wrong type {type(v).__name__}"
    if _num(v):
        if "minimum" in schema and v < schema["minimum"]:
            return at + ": below minimum"
        if "maximum" in schema and v > schema["maximum"]:
            return at + ": above maximum"
        if "exclusiveMinimum" in schema and v <= schema["exclusiveMinimum"]:
            return at + ": not above exclusiveMinimum"
        if "exclusiveMaximum" in schema and v >= schema["exclusiveMaximum"]:
            return at + ": not below exclusiveMaximum"
    if isinstance(v, str):
        if len(v) < schema.get("minLength", 0) or len(v) > schema.get("maxLength", math.inf):
            return at + ": length out of bounds"
    if isinstance(v, list):
        if len(v) < schema.get("minItems", 0) or len(v) > schema.get("maxItems", math.inf):
            return at + ": item count out of bounds"
        for i, x in enumerate(v):
            e = validate(x, schema.get("items", True), root, f"{at}[{i}]")
            if e:
                return e
    if isinstance(v, dict):
        props = schema.get("properties", {})
        for k in schema.get("required", []):
            if k not in v:
                return at + f": missing required {k!r}"
        for k, x in v.items():
            sub = props.get(k, schema.get("additionalProperties", True))
            e = validate(x, sub, root, f"{at}.{k}")
            if e:
                return e
    return ""
