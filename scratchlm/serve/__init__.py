"""`scratchlm serve`: a local web playground to watch a GPT think.

library.py lists the runs that may be shown and loads their models; streams.py turns generation
into a stream of events, stepped by the one thread that runs the model; app.py is the web app
(Starlette), guard.py what stands in front of it (whom it answers, and how long it waits), and
cli.py the command that starts it (uvicorn). static/ holds the page, its script and its style:
everything the browser loads comes from here, nothing from the internet.
"""
