"""``python -m viceroy.kernel -f {connection_file}``: launch the Viceroy kernel."""

from ipykernel.kernelapp import IPKernelApp

from viceroy.kernel.kernel import ViceroyKernel

if __name__ == "__main__":
    IPKernelApp.launch_instance(
        kernel_class=ViceroyKernel, outstream_class="viceroy.kernel.iostream.OutStream"
    )
