mod kernels;
