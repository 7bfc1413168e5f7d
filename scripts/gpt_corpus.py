"""Writes the GPT example's default corpus: the English reference text that ships inside every CPython
(pydoc_data.topics, what help('topic') prints), about 460 KB, in a fixed order. Any text file works
instead: `gpt prepare your.txt`.

    python scripts/gpt_corpus.py OUT.txt
"""
import pathlib
import sys

from pydoc_data import topics

out = pathlib.Path(sys.argv[1])
out.parent.mkdir(parents=True, exist_ok=True)
text = "\n\n".join(topics.topics[name].strip() for name in sorted(topics.topics)) + "\n"
out.write_text(text, encoding="utf-8")
print(f"{out}: {len(text.encode())} bytes of Python's documentation ({len(topics.topics)} topics)")
