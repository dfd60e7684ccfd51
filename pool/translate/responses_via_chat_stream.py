"""Responses client, Chat Completions provider: the streamed answer.

``chat.completion.chunk`` events in; out, as the official SDK's stream state expects them:
``response.created``, ``response.in_progress``, per output item ``response.output_item.added``
(``reasoning`` when a summary was asked for, ``message`` or ``function_call``),
``response.reasoning_summary_part.added``, ``response.reasoning_summary_text.delta`` /
``.done``, ``response.reasoning_summary_part.done``, ``response.content_part.added``,
``response.output_text.delta`` / ``.done``, ``response.content_part.done``,
``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``, and at
the end ``response.completed`` (or ``response.incomplete``) carrying the whole Response. A
failure after the stream started ends it as the Responses API does: ``response.failed``
carrying the Response so far with ``status: failed`` and ``error: {code, message}``. Every
event has a rising ``sequence_number``.
"""

from __future__ import annotations

import time
from typing import Any

from pool.translate.chat_chunks import ChatChunkTranslator
from pool.translate.common import named_event, upstream
from pool.translate.responses_via_chat import (
    Answering,
    call_item,
    message_item,
    reasoning_item,
    response_id,
    response_object,
    response_usage,
)


class ResponsesViaChatStream(ChatChunkTranslator):
    """One stream's state: the output items opened so far, the finish reason and usage."""

    def __init__(self, model: str, answering: Answering) -> None:
        super().__init__()
        self._model = model
        self._answering = answering
        self._echo = answering.echo
        self._id = ""
        self._created = int(time.time())
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # final items, in output order
        self._open: int = -1  # output index of the open item, -1 when none
        self._text_parts: list[str] = []
        self._args: list[str] = []
        self._calls: dict[int, int] = {}  # chat tool index -> output index
        self._reason: str | None = None
        self._usage_seen: dict[str, Any] | None = None

    def _emit(self, out: list[str], kind: str, **fields: Any) -> None:
        out.append(named_event(kind, {"type": kind, "sequence_number": self._seq, **fields}))
        self._seq += 1

    def _response(self, finish: str | None) -> dict[str, Any]:
        usage = self._usage_seen if finish is not None else None
        output = self._output if finish is not None else []
        return response_object(
            self._id, self._model, self._created, self._echo, output, finish, usage
        )

    def _first(self, chunk: dict[str, Any], out: list[str]) -> None:
        self._id = response_id(chunk.get("id"))
        self._model = str(chunk.get("model") or self._model)
        self._emit(out, "response.created", response=self._response(None))
        self._emit(out, "response.in_progress", response=self._response(None))

    def _usage(self, usage: dict[str, Any]) -> None:
        self._usage_seen = response_usage(usage)

    def _finish(self, reason: str) -> None:
        self._reason = reason

    # --- output items ---------------------------------------------------------------------

    def _reasoning(self, text: str, out: list[str]) -> None:
        if not self._answering.summary:
            return
        if self._open < 0 or self._output[self._open]["type"] != "reasoning":
            self._close_item(out)
            item = reasoning_item(f"rs_{self._id.removeprefix('resp_')}_{len(self._output)}", "")
            index = self._add(item, out)
            self._emit(
                out,
                "response.reasoning_summary_part.added",
                item_id=item["id"],
                output_index=index,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
        self._text_parts.append(text)
        self._emit(
            out,
            "response.reasoning_summary_text.delta",
            item_id=self._output[self._open]["id"],
            output_index=self._open,
            summary_index=0,
            delta=text,
        )

    def _text(self, text: str, out: list[str]) -> None:
        if self._open < 0 or self._output[self._open]["type"] != "message":
            self._close_item(out)
            item = message_item(
                f"msg_{self._id.removeprefix('resp_')}_{len(self._output)}", "", "in_progress"
            )
            index = self._add(item, out)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self._emit(
                out,
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        self._text_parts.append(text)
        item = self._output[self._open]
        self._emit(
            out,
            "response.output_text.delta",
            item_id=item["id"],
            output_index=self._open,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _tool(self, call: dict[str, Any], out: list[str]) -> None:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        at = self._calls.get(index)
        if at is None:
            self._close_item(out)
            name, namespace = self._answering.call_name(str(fn.get("name") or ""))
            call_id = str(call.get("id") or f"call_{index}")
            item = call_item(call_id, name, "", "in_progress", namespace)
            at = self._calls[index] = self._add(item, out)
        elif at != self._open:
            raise upstream("the provider interleaved tool call deltas; they cannot be carried over")
        part = fn.get("arguments")
        if isinstance(part, str) and part:
            self._args.append(part)
            self._emit(
                out,
                "response.function_call_arguments.delta",
                item_id=self._output[at]["id"],
                output_index=at,
                delta=part,
            )

    def _add(self, item: dict[str, Any], out: list[str]) -> int:
        index = len(self._output)
        self._output.append(item)
        self._open = index
        self._emit(out, "response.output_item.added", output_index=index, item=dict(item))
        return index

    def _close_item(self, out: list[str]) -> None:
        if self._open < 0:
            return
        index, item = self._open, self._output[self._open]
        if item["type"] == "message":
            text = "".join(self._text_parts)
            done = message_item(item["id"], text)
            part = done["content"][0]
            self._emit(
                out,
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
            self._emit(
                out,
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
            self._text_parts = []
        elif item["type"] == "reasoning":
            text = "".join(self._text_parts)
            done = reasoning_item(item["id"], text)
            part = {"type": "summary_text", "text": text}
            common = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            self._emit(out, "response.reasoning_summary_text.done", **common, text=text)
            self._emit(out, "response.reasoning_summary_part.done", **common, part=part)
            self._text_parts = []
        else:
            arguments = "".join(self._args)
            done = call_item(
                item["call_id"], item["name"], arguments, namespace=item.get("namespace")
            )
            self._emit(
                out,
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=arguments,
            )
            self._args = []
        self._output[index] = done
        self._emit(out, "response.output_item.done", output_index=index, item=done)
        self._open = -1

    def _end(self, out: list[str]) -> None:
        """At ``[DONE]`` or the upstream's end: close the open item and complete."""
        if self._reason is None:
            super()._end(out)
        self._done = True
        self._close_item(out)
        response = self._response(self._reason)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        self._emit(out, kind, response=response)

    def failed(self, code: str, message: str) -> str:
        """``response.failed`` with the output so far (R-XLATE-1); nothing after an end."""
        if self._done:
            return ""
        self._done = True
        if not self._id:
            self._id = response_id(None)
        response = response_object(
            self._id, self._model, self._created, self._echo, self._output, None, self._usage_seen
        )
        response.update(status="failed", error={"code": code, "message": message})
        out: list[str] = []
        self._emit(out, "response.failed", response=response)
        return "".join(out)
