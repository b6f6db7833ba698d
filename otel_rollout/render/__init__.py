"""One render layer: every field described once (:mod:`.fields`), and the text
(:mod:`.text`), JSON (:mod:`.records`) and HTML (:mod:`.html`, :mod:`.svg`) of the read
commands made from those descriptions."""
