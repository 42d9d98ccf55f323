"""``treadle ui``: a read-only local web viewer of projects, tables, episodes, runs and
the exact samples of any step (extra ``treadle[ui]``: Starlette under uvicorn).

:func:`treadle.ui.serve.serve` runs it; :func:`treadle.ui.app.create_app` is the ASGI app;
:mod:`treadle.ui.step` is the step view ``treadle show`` writes. Every asset ships in the
package (``static/``): the pages load nothing from a network.
"""
