"""dex_ha.models — model providers for the Worker SDK, each behind an optional extra.

Each provider implements the Worker's model protocol (`respond(request, stream)` and
`summarize(history, summary)`, see dex_ha.worker.model) on an official SDK. Import the one
you use; this package imports none of them, so that no extra is needed to import it:

    from dex_ha.models.openai import OpenAIModel        # pip install -e '.[openai]'
    from dex_ha.models.anthropic import AnthropicModel  # pip install -e '.[anthropic]'
"""
