"""A user's own data files: labelled text and instructions, read row by row with one-line errors.

Formats, by the file's suffix:

| suffix | rows |
|---|---|
| `.csv` | comma-separated, a header line naming the columns; fields may be double-quoted |
| `.tsv` | tab-separated, a header line; fields may be double-quoted |
| `.jsonl`, `.ndjson` | one JSON object per line |
| `.json` | a JSON list of objects (Stanford Alpaca's format) |

`read_text_rows(path, columns)` reads labelled text (`TextColumns`: the text, an optional second
text for sentence pairs, the label and an optional client column) into `TextRows`, labels kept as
strings; `label_names(rows)` orders them and `encoded_labels(rows, names)` maps a split's labels
to those indices. `read_instruction_rows(path, client_column)` reads prompt/response pairs:
Alpaca's `instruction` (+ optional `input`) and `output`, prompted with Alpaca's templates
(`tasks.instructions`), or `prompt` and `response` as they are (`instruction_form(path)` says
which); prompts to generate from may come without responses (`require_responses=False`).

Every error is a `ValueError` of one line naming the file, and where one applies the line and the
column: a missing column, a short row, an empty text, label or client, a label of another split
that training never saw, a line that is not UTF-8, a JSON syntax error.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> _ = (folder / "train.csv").write_text('text,label,user\\n"good, really",pos,u1\\nbad,neg,u2\\n')
>>> rows = read_text_rows(folder / "train.csv", TextColumns(client="user"))
>>> rows.texts[0].tolist(), rows.labels.tolist(), rows.clients.tolist(), rows.lines.tolist()
(['good, really', 'bad'], ['pos', 'neg'], ['u1', 'u2'], [2, 3])
>>> names = label_names(rows)
>>> names, encoded_labels(rows, names).tolist()
(('neg', 'pos'), [1, 0])
>>> _ = (folder / "dev.csv").write_text("text,label\\nfine,meh\\n")
>>> encoded_labels(read_text_rows(folder / "dev.csv", TextColumns()), names)
Traceback (most recent call last):
...
ValueError: ...dev.csv: line 2, column 'label': label 'meh' does not occur in the training rows (their labels: neg, pos)
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
from collections.abc import Iterator

import numpy as np

from tasks import instructions

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json"}


@dataclasses.dataclass(frozen=True)
class TextColumns:
    """The columns (JSON: keys) of labelled text: `text`, an optional second text `pair`
    (sentence pairs), the `label` and an optional `client`."""

    text: str = "text"
    pair: str | None = None
    label: str = "label"
    client: str | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The columns every row needs, in this order."""
        return tuple(c for c in (self.text, self.pair, self.label, self.client) if c)


@dataclasses.dataclass(frozen=True)
class TextRows:
    """n labelled texts of one file.

    Attributes:
      path: the file.
      texts: one or two object arrays of str, (n,) each (the text, and the pair's second text).
      labels: object array of str (n,), the labels as written.
      clients: object array of str (n,), or None without a client column.
      lines: int array (n,), the line each row starts on (for messages).
      columns: the `TextColumns` read.
    """

    path: pathlib.Path
    texts: tuple[np.ndarray, ...]
    labels: np.ndarray
    clients: np.ndarray | None
    lines: np.ndarray
    columns: TextColumns

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx) -> TextRows:
        """The rows at indices `idx`."""
        idx = np.asarray(idx, dtype=np.int64)
        return dataclasses.replace(
            self, texts=tuple(t[idx] for t in self.texts), labels=self.labels[idx],
            clients=None if self.clients is None else self.clients[idx], lines=self.lines[idx])


@dataclasses.dataclass(frozen=True)
class InstructionRows:
    """n prompt/response pairs of one file (`prompts`, `responses`: tuples of str), each row's
    client (object array (n,), or None) and the line it starts on."""

    path: pathlib.Path
    prompts: tuple[str, ...]
    responses: tuple[str, ...]
    clients: np.ndarray | None
    lines: np.ndarray

    def __len__(self) -> int:
        return len(self.prompts)

    def subset(self, idx) -> InstructionRows:
        """The rows at indices `idx`."""
        idx = np.asarray(idx, dtype=np.int64)
        return dataclasses.replace(
            self, prompts=tuple(self.prompts[i] for i in idx),
            responses=tuple(self.responses[i] for i in idx),
            clients=None if self.clients is None else self.clients[idx], lines=self.lines[idx])

    def examples(self, idx=None) -> instructions.InstructionExamples:
        """The pairs (at indices `idx`, default all) as `tasks.instructions.InstructionExamples`."""
        idx = range(len(self)) if idx is None else np.asarray(idx, dtype=np.int64)
        return instructions.InstructionExamples(tuple(self.prompts[i] for i in idx),
                                                tuple(self.responses[i] for i in idx))


def file_format(path: str | pathlib.Path) -> str:
    """"csv", "tsv", "jsonl" or "json", by `path`'s suffix (ValueError naming the suffixes
    known)."""
    suffix = pathlib.Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"{path}: unknown file type {suffix or '(no suffix)'!r}; name it "
                         f"{', '.join(FORMATS)}")
    return FORMATS[suffix]


def _text_of(path: pathlib.Path) -> str:
    """The file's text; a line that is not UTF-8 is named with its byte."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    for number, line in enumerate(raw.split(b"\n"), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: line {number}: not UTF-8 (byte 0x{line[e.start]:02x} at "
                             f"column {e.start + 1}); save the file as UTF-8") from None
    raise ValueError(f"{path}: not UTF-8; save the file as UTF-8")


def _json_error(path: pathlib.Path, error: json.JSONDecodeError, line: int | None = None) -> str:
    return (f"{path}: line {line or error.lineno}, column {error.colno}: JSON syntax error: "
            f"{error.msg}")


def _delimited_rows(path: pathlib.Path, text: str, delimiter: str
                    ) -> Iterator[tuple[int, dict]]:
    """(line, {column: value}) of a headed CSV or TSV text (a blank line is skipped)."""
    csv.field_size_limit(1 << 30)
    reader = csv.reader(text.splitlines(keepends=True), delimiter=delimiter, quotechar='"')
    header = next(reader, None)
    if not header:
        raise ValueError(f"{path}: empty file (expected a header line naming the columns)")
    header = [h.strip() for h in header]
    start = reader.line_num + 1
    for row in reader:
        line, start = start, reader.line_num + 1
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            raise ValueError(f"{path}: line {line}: {len(row)} field(s), the header has "
                             f"{len(header)} ({', '.join(header)})")
        yield line, dict(zip(header, row))


def _json_lines(path: pathlib.Path, text: str) -> Iterator[tuple[int, dict]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(_json_error(path, e, number)) from None
        yield number, row


def _json_list(path: pathlib.Path, text: str) -> Iterator[tuple[int, dict]]:
    """The objects of a JSON list, each with the line it starts on."""
    decoder = json.JSONDecoder()
    position = len(text) - len(text.lstrip())
    if not text.startswith("[", position):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(_json_error(path, e)) from None
        raise ValueError(f"{path}: expected a JSON list of objects, got a "
                         f"{type(value).__name__} (a file of one object per line is .jsonl)")
    position += 1
    while True:
        while position < len(text) and text[position] in " \t\r\n":
            position += 1
        if text.startswith("]", position):
            break
        try:
            row, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as e:
            raise ValueError(_json_error(path, e)) from None
        yield text.count("\n", 0, position) + 1, row
        position = end
        while position < len(text) and text[position] in " \t\r\n":
            position += 1
        if text.startswith(",", position):
            position += 1
        elif not text.startswith("]", position):
            error = json.JSONDecodeError("Expecting ',' delimiter", text, position)
            raise ValueError(_json_error(path, error))


def read_rows(path: str | pathlib.Path) -> Iterator[tuple[int, dict]]:
    """`(line, row)` of every row of a data file (module docstring's formats): a row maps each
    column (JSON key) to its value; a JSON row that is not an object is refused."""
    path = pathlib.Path(path)
    kind = file_format(path)
    text = _text_of(path)
    rows = {"csv": lambda: _delimited_rows(path, text, ","),
            "tsv": lambda: _delimited_rows(path, text, "\t"),
            "jsonl": lambda: _json_lines(path, text),
            "json": lambda: _json_list(path, text)}[kind]()
    for line, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {line}: a JSON {type(row).__name__}, not an object")
        yield line, row


def columns_of(path: str | pathlib.Path) -> tuple[str, ...]:
    """The columns (JSON keys) of the file's first row (empty for a file without rows)."""
    for _, row in read_rows(path):
        return tuple(row)
    return ()


def _field(path, line: int, row: dict, column: str, what: str) -> str:
    """`row[column]` as a non-empty string (JSON numbers and booleans as written)."""
    if column not in row:
        raise ValueError(f"{path}: line {line}: no {what} column {column!r} (its columns: "
                         f"{', '.join(row)})")
    value = row[column]
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, (int, float)):
        value = str(value)
    elif not isinstance(value, str):
        raise ValueError(f"{path}: line {line}, column {column!r}: a JSON "
                         f"{type(value).__name__}, not a string")
    if not value.strip():
        raise ValueError(f"{path}: line {line}, column {column!r}: empty {what}")
    return value


def read_text_rows(path: str | pathlib.Path, columns: TextColumns) -> TextRows:
    """The labelled texts of `path` (`TextColumns` names the columns).

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line naming the file (and line and column): a missing column (with the
        columns the file has), a short row, an empty text, label or client, not UTF-8, a JSON
        syntax error, or a file without rows.
    """
    path = pathlib.Path(path)
    fields: dict[str, list[str]] = {c: [] for c in columns.names}
    lines: list[int] = []
    what = {columns.text: "text", columns.pair: "text", columns.label: "label",
            columns.client: "client"}
    for line, row in read_rows(path):
        if not lines:
            missing = [c for c in columns.names if c not in row]
            if missing:
                flag = {columns.text: "text_column", columns.pair: "text_pair_column",
                        columns.label: "label_column", columns.client: "client_column"}
                raise ValueError(
                    f"{path}: no column {missing[0]!r} (its columns: {', '.join(row)}); name the "
                    f"{what[missing[0]]} column with {flag[missing[0]]}=<one of them>")
        for column in columns.names:
            fields[column].append(_field(path, line, row, column, what[column]))
        lines.append(line)
    if not lines:
        raise ValueError(f"{path}: no rows")
    texts = tuple(np.array(fields[c], dtype=object) for c in (columns.text, columns.pair) if c)
    clients = np.array(fields[columns.client], dtype=object) if columns.client else None
    return TextRows(path, texts, np.array(fields[columns.label], dtype=object), clients,
                    np.array(lines, np.int64), columns)


def label_names(rows: TextRows) -> tuple[str, ...]:
    """The training rows' distinct labels in index order: numerically when every label is an
    integer (so "0", "1" keep their meaning), else alphabetically."""
    distinct = set(rows.labels.tolist())
    try:
        return tuple(sorted(distinct, key=int))
    except ValueError:
        return tuple(sorted(distinct))


def encoded_labels(rows: TextRows, names: tuple[str, ...]) -> np.ndarray:
    """int32 (n,): each row's label's index in `names`; a label training never saw is refused
    with its file, line and column."""
    index = {name: i for i, name in enumerate(names)}
    for label, line in zip(rows.labels, rows.lines):
        if label not in index:
            raise ValueError(
                f"{rows.path}: line {line}, column {rows.columns.label!r}: label {label!r} does "
                f"not occur in the training rows (their labels: {', '.join(names)})")
    return np.array([index[label] for label in rows.labels], np.int32)


def _response(path, line: int, row: dict, column: str, required: bool) -> str:
    """`row[column]` (`_field`), or "" when not `required` and the row has none (or a blank)."""
    value = row.get(column)
    if not required and (value is None or (isinstance(value, str) and not value.strip())):
        return ""
    return _field(path, line, row, column, column)


def check_clients_known(held_out, train, client_column: str | None) -> None:
    """A one-line ValueError naming the file, line and column of the first row of `held_out`
    (`TextRows` or `InstructionRows` of a dev or test file) whose client has no rows in
    `train`; nothing when `held_out` has no clients."""
    if held_out.clients is None:
        return
    unknown = sorted(set(held_out.clients.tolist()) - set(train.clients.tolist()))
    if unknown:
        line = int(held_out.lines[list(held_out.clients).index(unknown[0])])
        raise ValueError(f"{held_out.path}: line {line}, column {client_column!r}: client "
                         f"{unknown[0]!r} has no training rows in {train.path}")


def read_instruction_rows(path: str | pathlib.Path, client_column: str | None = None,
                          require_responses: bool = True) -> InstructionRows:
    """The prompt/response pairs of `path`: each row has Alpaca's `instruction` (and an optional
    `input`) and `output`, prompted with Alpaca's templates (`tasks.instructions.alpaca_prompt`),
    or a `prompt` and a `response` used as they are; `client_column` names each row's client.
    Without `require_responses` (prompts to generate from), a row may lack its response: it is
    then "".

    Raises:
      FileNotFoundError: no such file.
      ValueError: one line naming the file, line and key: a row with neither form, an empty
        instruction, prompt, response or client, not UTF-8, a JSON syntax error, no rows.
    """
    path = pathlib.Path(path)
    prompts, responses, clients, lines = [], [], [], []
    for line, row in read_rows(path):
        if "instruction" in row:
            instruction = _field(path, line, row, "instruction", "instruction")
            response = _response(path, line, row, "output", require_responses)
            extra = row.get("input")
            if extra is not None and not isinstance(extra, str):
                raise ValueError(f"{path}: line {line}, column 'input': a JSON "
                                 f"{type(extra).__name__}, not a string")
            prompt = instructions.alpaca_prompt(instruction, extra)
        elif "prompt" in row:
            prompt = _field(path, line, row, "prompt", "prompt")
            response = _response(path, line, row, "response", require_responses)
        else:
            raise ValueError(f"{path}: line {line}: neither 'instruction' and 'output' (Alpaca) "
                             f"nor 'prompt' and 'response' (its keys: {', '.join(row)})")
        if client_column is not None:
            clients.append(_field(path, line, row, client_column, "client"))
        prompts.append(prompt)
        responses.append(response)
        lines.append(line)
    if not lines:
        raise ValueError(f"{path}: no rows")
    return InstructionRows(path, tuple(prompts), tuple(responses),
                           np.array(clients, dtype=object) if client_column else None,
                           np.array(lines, np.int64))


def instruction_form(path: str | pathlib.Path) -> str:
    """How the rows of an instruction file are prompted (`read_instruction_rows`): "alpaca" when
    every row is Alpaca's (`instruction`), "as_written" when every row is a `prompt`, "mixed"
    when it holds both (`tasks.instructions.PROMPT_STYLES` names the first two)."""
    forms = {"alpaca" if "instruction" in row else "as_written" for _, row in read_rows(path)}
    if not forms:
        raise ValueError(f"{path}: no rows")
    return forms.pop() if len(forms) == 1 else "mixed"
