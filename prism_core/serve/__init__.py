"""``prism serve``: an OpenAI-compatible HTTP server over one model (docs/serve.md).

Layers: :mod:`.schemas` validates request bodies (a bad field is a :class:`BadRequest` naming it),
:mod:`.templates` renders chat templates in jinja2's sandbox, :mod:`.slots` admits requests (slots, then a
bounded queue, then 503), and :mod:`.app` is the Starlette application. The admitted requests share each
step of a :class:`prism_core.models.engine.Engine` (continuous batching). Needs the ``serve`` extra
(starlette, uvicorn, jinja2).
"""
