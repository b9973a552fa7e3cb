"""``yaml.safe_load`` that refuses a key given twice in one mapping.

PyYAML (like the YAML spec's loaders in practice) keeps the last value of a repeated key without a
word, so a recipe with two ``target:`` lines runs with whichever came last. The loader below is
SafeLoader with one more check in construct_mapping; PyYAML has no option for it, ruamel.yaml does
but would be a second YAML library for ten lines.
"""

from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names the same key twice; ``problem_mark`` is the second occurrence."""

    def __init__(self, key, first_line: int, second_line: int, mark):
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(problem=f"key {key!r} is given twice (lines {first_line} and {second_line}); "
                                 "YAML would silently keep the last value, so keep one", problem_mark=mark)


class UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKeyError(key, seen[key], line, key_node.start_mark)
                    seen[key] = line
                except TypeError:  # an unhashable key: SafeLoader's own error says so below
                    continue
        return super().construct_mapping(node, deep=deep)


def load(text: str):
    """The document in TEXT with safe_load's types and semantics, or DuplicateKeyError (a YAMLError)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - UniqueKeyLoader is a SafeLoader
