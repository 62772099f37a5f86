"""The message tool: say something in the current chat before the turn ends."""

from __future__ import annotations

from pydantic import Field

from nanobot.tools.base import Tool, ToolError, ToolParams, tool_context


class MessageParams(ToolParams):
    text: str = Field(min_length=1, description="The message to send to the user now.")


class MessageTool(Tool[MessageParams]):
    """Sends text to the chat of the current turn right away (progress on a long task).

    What it sends is recorded in the turn's context, so the loop does not repeat it as the
    final reply.
    """

    name = "message"
    description = (
        "Send a message to the user right away, before your final reply (e.g. progress on a "
        "long task). Do not repeat what you sent this way in your final reply."
    )
    params = MessageParams

    async def run(self, args: MessageParams) -> str:
        context = tool_context()
        if context.send is None:
            raise ToolError(
                "there is no chat to send a message to in this turn; put it in your final reply"
            )
        await context.send(args.text)
        context.sent.append(args.text)
        return "message sent"
