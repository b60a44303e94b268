"""The patterns of one-line text fields, shared by the recipe's structs and those of their own modules."""

# Every pattern ends in END ("no character follows") rather than `$`: `$` also matches before a final
# "\n", and msgspec checks patterns with re.search, so "p\n" would pass as one line. Python and
# ECMAScript (editors reading the JSON Schema) read END the same way.
END = r"(?![\s\S])"
# What no one-line field may hold: C0 controls but tab, DEL, C1 controls (NEL among them) and the
# Unicode line and paragraph separators. A line break in an #SBATCH value would start a new script line.
LINE_BREAKING = r"\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029"
LINE_PATTERN = f"^[^{LINE_BREAKING}]*{END}"
NON_EMPTY_LINE_PATTERN = f"^[^{LINE_BREAKING}]+{END}"
