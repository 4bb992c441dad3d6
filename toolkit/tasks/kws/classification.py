"""Command-word (utterance classification) scoring: accuracy, per-class precision and
recall, and the confusion matrix, as text, JSON and a PNG.

Each utterance gets one class: argmax of the model's class probabilities. A classifier
(BC-ResNet) already gives one (K,) vector per utterance; a streaming model gives frame
posteriors (T, K), which are averaged over frames first. Utterances whose label is -1
(no class) or outside the inventory cannot be scored; they are counted, named in the
report and left out, never silently dropped.
"""
import io
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from toolkit.fileio import atomic_write_bytes, atomic_write_text
from toolkit.tasks.kws.scoring import json_safe

logger = logging.getLogger(__name__)

MAX_EXAMPLES = 5


def utterance_probs(backend, feats: np.ndarray) -> np.ndarray:
    """(K,) class scores of one whole utterance; the backend state starts fresh."""
    backend.reset()
    out = np.asarray(backend.step(feats), dtype=np.float64)
    if out.ndim == 2:          # frame posteriors of a streaming model
        if len(out) == 0:
            raise ValueError("model produced no frames")
        out = out.mean(axis=0)
    if out.ndim != 1:
        raise ValueError(f"unexpected model output shape {out.shape}")
    return out


def confusion_matrix(labels: Sequence[int], preds: Sequence[int], num_classes: int) -> np.ndarray:
    """(K, K) counts; row = true class, column = predicted class."""
    labels = np.asarray(labels, dtype=np.int64)
    preds = np.asarray(preds, dtype=np.int64)
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (labels, preds), 1)
    return matrix


def _ratio(num: int, den: int) -> Optional[float]:
    return num / den if den else None


def class_report(matrix: np.ndarray, names: Sequence[str]) -> dict:
    """Overall accuracy and per-class counts/accuracy/precision/recall/F1 from a matrix.
    Per-class accuracy is correct / count, i.e. the class's recall; precision is None
    for a class that was never predicted, recall None for a class with no utterances."""
    correct = int(np.trace(matrix))
    total = int(matrix.sum())
    per_class = []
    for k, name in enumerate(names):
        tp = int(matrix[k, k])
        count = int(matrix[k].sum())
        predicted = int(matrix[:, k].sum())
        precision, recall = _ratio(tp, predicted), _ratio(tp, count)
        f1 = (2 * precision * recall / (precision + recall)
              if precision is not None and recall is not None and precision + recall > 0 else None)
        per_class.append({"class": name, "count": count, "predicted": predicted, "correct": tp,
                          "accuracy": recall, "precision": precision, "recall": recall, "f1": f1})
    return {"accuracy": _ratio(correct, total), "correct": correct, "total": total,
            "num_classes": len(names), "per_class": per_class}


@dataclass
class Skipped:
    """Utterances left out of scoring, by reason, with a few example keys."""
    counts: Counter = field(default_factory=Counter)
    examples: Dict[str, List[str]] = field(default_factory=dict)

    def add(self, reason: str, key: str) -> None:
        self.counts[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append(key)

    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> List[str]:
        return [f"{reason}: {n} (e.g. {', '.join(self.examples[reason])})"
                for reason, n in self.counts.most_common()]

    def to_json(self) -> dict:
        return {reason: {"count": n, "examples": self.examples[reason]}
                for reason, n in self.counts.most_common()}


def summary_line(report: dict) -> str:
    acc = report["accuracy"]
    pct = f"{100 * acc:.2f}%" if acc is not None else "n/a"
    return (f"accuracy {pct} ({report['correct']}/{report['total']}) over "
            f"{report['num_classes']} classes")


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def format_report(report: dict, skipped: Skipped) -> str:
    rows = [("class", "count", "predicted", "correct", "accuracy%", "precision%", "recall%", "f1%")]
    for c in report["per_class"]:
        rows.append((c["class"], str(c["count"]), str(c["predicted"]), str(c["correct"]),
                     _fmt(c["accuracy"]), _fmt(c["precision"]), _fmt(c["recall"]), _fmt(c["f1"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = [("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(r, widths)))).rstrip() for r in rows]
    out = [summary_line(report), "",
           "per class (accuracy = correct / count, i.e. recall; '-' = undefined):", *table, "",
           f"skipped utterances: {skipped.total()}"]
    out += ["  " + line for line in skipped.lines()]
    return "\n".join(out) + "\n"


def format_confusion(matrix: np.ndarray, names: Sequence[str]) -> str:
    """Aligned matrix: rows true class, columns predicted class, with row totals."""
    corner = "true \\ predicted"
    head = [corner, *names, "total"]
    body = [[name, *(str(int(v)) for v in matrix[k]), str(int(matrix[k].sum()))]
            for k, name in enumerate(names)]
    body.append(["total", *(str(int(v)) for v in matrix.sum(axis=0)), str(int(matrix.sum()))])
    rows = [head] + body
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows) + "\n"


def plot_confusion(path: str, matrix: np.ndarray, names: Sequence[str], title: str = "") -> None:
    # Figure + Agg canvas directly (no pyplot global state), as scoring.plot_det does.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    k = len(names)
    side = min(20.0, max(4.0, 0.55 * k + 2.5))
    fig = Figure(figsize=(side + 1.0, side), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    # Colour by the row-normalised rate so rare classes are as readable as common ones;
    # the annotations are the raw counts.
    rows = matrix.sum(axis=1, keepdims=True)
    rate = np.divide(matrix, rows, out=np.zeros(matrix.shape, dtype=np.float64), where=rows > 0)
    image = ax.imshow(rate, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of true class")
    ax.set_xticks(range(k))
    ax.set_yticks(range(k))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_yticklabels(names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title or "confusion matrix")
    fontsize = max(5, min(10, int(120 / max(k, 1))))
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(int(matrix[i, j])), ha="center", va="center", fontsize=fontsize,
                    color="white" if rate[i, j] > 0.5 else "black")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())


def write_outputs(out_dir: str, matrix: np.ndarray, names: Sequence[str], skipped: Skipped,
                  predictions: Sequence[tuple] = (), model: str = "") -> dict:
    """accuracy.txt, confusion.{txt,json,png} (and predictions.txt) in out_dir."""
    report = class_report(matrix, names)
    atomic_write_text(os.path.join(out_dir, "accuracy.txt"), format_report(report, skipped))
    atomic_write_text(os.path.join(out_dir, "confusion.txt"), format_confusion(matrix, names))
    doc = dict(report, classes=list(names), matrix=matrix.tolist(), model=model,
               skipped={"total": skipped.total(), "by_reason": skipped.to_json()})
    atomic_write_text(os.path.join(out_dir, "confusion.json"),
                      json.dumps(json_safe(doc), indent=1) + "\n")
    plot_confusion(os.path.join(out_dir, "confusion.png"), matrix, names, summary_line(report))
    if predictions:
        lines = [f"{key} {names[t]} {names[p]} {score:.6f}\n" for key, t, p, score in predictions]
        atomic_write_text(os.path.join(out_dir, "predictions.txt"), "".join(lines))
    return report
