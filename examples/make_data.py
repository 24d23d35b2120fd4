"""Tiny generated data sets for trying the examples (and for their tests): no download needed.

    python examples/make_data.py wikitext DIR   # DIR/{train,valid,test}.txt in WikiText-2's word-level format
    python examples/make_data.py images DIR     # DIR/<class>/<n>.png: an ImageFolder of small RGB images

The text is drawn from a fixed random bigram model, so a language model can learn it (its loss falls);
the images of each class share a colour and a stripe pattern, so a classifier can learn them too.
Both are deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path


def make_wikitext(
    out: str | Path, lines: tuple[int, int, int] = (400, 60, 60), vocab: int = 200, seed: int = 0
) -> Path:
    """Write train.txt, valid.txt and test.txt (WikiText-2 layout: ' = Title = ' headings, tokenised words
    separated by spaces, blank lines between paragraphs) with `lines` paragraph lines per split."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)] + [",", ".", "the", "of", "@-@"]
    successors = {w: rng.sample(words, 4) for w in words}  # each word is followed by one of 4 others
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        text = []
        for i in range(n):
            if i % 20 == 0:
                text += ["", f" = {rng.choice(words)} {rng.choice(words)} = ", ""]
            word = rng.choice(words)
            sentence = [word]
            for _ in range(rng.randint(8, 30)):
                word = rng.choice(successors[word])
                sentence.append(word)
            text.append(" " + " ".join(sentence) + " ")
        (out / f"{split}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return out


def make_images(
    out: str | Path, classes: int = 3, per_class: int = 16, size: int = 32, seed: int = 0
) -> Path:
    """Write an ImageFolder directory: `classes` sub-directories of `per_class` size x size RGB PNGs."""
    from PIL import Image

    rng = random.Random(seed)
    out = Path(out)
    for c in range(classes):
        folder = out / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        base = [rng.randrange(256) for _ in range(3)]
        period = 2 + 2 * c
        for n in range(per_class):
            img = Image.new("RGB", (size, size))
            pixels = [
                tuple(
                    max(0, min(255, v + (60 if (x // period) % 2 else -60) + rng.randint(-30, 30)))
                    for v in base
                )
                for _y in range(size)
                for x in range(size)
            ]
            img.putdata(pixels)
            img.save(folder / f"{n:04d}.png")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["wikitext", "images"])
    parser.add_argument("out", help="directory to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.kind == "wikitext":
        print(f"wrote {make_wikitext(args.out, seed=args.seed)}")
    else:
        print(f"wrote {make_images(args.out, seed=args.seed)}")


if __name__ == "__main__":
    main()
