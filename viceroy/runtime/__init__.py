"""Everything that runs a mesh: controller, agents, ranks, messages. Imports nothing from
Jupyter, so a plain Python script can drive a mesh."""
